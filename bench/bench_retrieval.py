"""Retrieval on the deployed embedding (issue 12): cosine 1-NN recall@1 of the digits ViT's fp32,
fp16 and int8 graphs, with digits:train (1,437 images) as the index and digits:test (360) as queries.

The bundle is exported with ``--outputs logits,probs,embedding,patch_grid`` and an fp16 graph, then
calibrated to int8 with ``vitdeploy calibrate``'s defaults (the ladder, gated on logits and the
embedding). The int8 graph is scored twice, as `check` does: in reference semantics (ORT "basic":
Q/DQ as fake-quant in float, what TensorRT computes) and on this CPU's integer kernels (ORT "all").
Also reported: the embedding's cosine with fp32 (1st percentile and worst query) and the share of
queries whose nearest neighbour is the same index image as fp32's.

    .venv/bin/python bench/bench_retrieval.py                          # ~2 min on 2 cores
    .venv/bin/python bench/bench_retrieval.py --work /tmp/br --json retrieval.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path



def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build_bundle(work: Path) -> Path:
    from vitdeploy.bundle import Bundle
    from vitdeploy.calibration.api import calibrate_bundle
    from vitdeploy.exporters import ExportOptions, export

    target = work / "digits-features"
    if (target / "manifest.json").is_file() and "int8" in Bundle.open(target).precisions():
        return target
    export("builtin:digits", target, ExportOptions(outputs=("logits", "probs", "embedding", "patch_grid"), precisions=("fp32", "fp16")), log=log)
    calibrate_bundle(target, log=log)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="folder for the bundle (kept; default: a temporary folder)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    from vitdeploy.compare import cosine_percentile, cosine_rows
    from vitdeploy.retrieval import nearest_neighbours, recall_at_1

    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-retrieval.")
        args.work = Path(tmp.name)
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    bundle = build_bundle(args.work)
    from vitdeploy.retrieval import bundle_retrieval

    rows, fp32 = [], None
    for precision, optimization, label in (("fp32", "all", "fp32"), ("fp16", "all", "fp16 (LayerNorm, Softmax fp32)"),
                                           ("int8", "basic", "int8 Q/DQ, reference semantics (TensorRT)"),
                                           ("int8", "all", "int8 Q/DQ, this CPU's integer kernels")):
        result = bundle_retrieval(bundle, precision, optimization=optimization, threads=args.threads)
        idx, queries = result.pop("embeddings")
        row = {"graph": label, **result}
        if fp32 is None:
            fp32 = (idx, queries, nearest_neighbours(idx, queries))
        else:
            cos = cosine_rows(fp32[1], queries)
            row["embedding_cosine_p1_vs_fp32"] = cosine_percentile(cos)
            row["embedding_cosine_min_vs_fp32"] = float(cos.min())
            row["same_neighbour_as_fp32"] = float((nearest_neighbours(idx, queries) == fp32[2]).mean())
            # the fp32 index searched with this graph's queries: what a mixed deployment would see
            from vitdeploy.retrieval import labelled_split

            _, idx_labels = labelled_split("digits:train")
            _, q_labels = labelled_split("digits:test")
            row["recall_at_1_fp32_index"] = recall_at_1(fp32[0], idx_labels, queries, q_labels)
        rows.append(row)
        log(f"{label}: recall@1 {row['recall_at_1']:.2%}")

    print(f"cosine 1-NN recall@1, index digits:train ({rows[0]['index_count']}), queries digits:test ({rows[0]['query_count']}), "
          f"embedding d={rows[0]['dim']}")
    print(f"{'graph':45s} {'recall@1':>9s} {'vs fp32':>8s} {'emb cos p1':>10s} {'worst':>8s} {'same NN':>8s} {'fp32 index':>10s}")
    for row in rows:
        delta = (row["recall_at_1"] - rows[0]["recall_at_1"]) * 100
        print(f"{row['graph']:45s} {row['recall_at_1']:9.2%} {delta:+7.2f}pt "
              f"{row.get('embedding_cosine_p1_vs_fp32', 1.0):10.4f} {row.get('embedding_cosine_min_vs_fp32', 1.0):8.4f} "
              f"{row.get('same_neighbour_as_fp32', 1.0):8.2%} {row.get('recall_at_1_fp32_index', row['recall_at_1']):10.2%}")
    load = os.getloadavg()
    print(f"({time.perf_counter() - start:.0f} s; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {platform.processor() or platform.machine()})")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "load_average": load}, indent=1))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
