"""Token merging (issue 40): measured speed-up against the cost model, and the price in accuracy.

Speed: ViT-B/16 at 224 (random weights: timing only) exported unmerged and with r = 4, 8, 13 tokens
merged per block, every graph loaded in one process and timed on ONNX Runtime's CPU provider in
interleaved rounds (r order reversed every other round), so drift and other processes fall on all
graphs alike. Each round gives the ratio t(r=0) / t(r) from the medians of its own calls; the table
reports the median and the range of those ratios over the rounds, beside the cost model's predicted
ratio (vitdeploy.costs.merge_costs: MACs of the unmerged model / MACs of the merged one, the merge
itself included). Absolute times move with the load of this shared machine; ratios hold better.

Price: the digits bundle exported unmerged and at r = 2, 4, 8; accuracy on digits:test of each
graph, and its top-1 agreement with the unmerged graph.

    .venv/bin/python bench/bench_token_merge.py                       # ViT-B/16, batch 1 and 8, + digits
    .venv/bin/python bench/bench_token_merge.py --rounds 5 --calls 6 --json /tmp/tome.json
    .venv/bin/python bench/bench_token_merge.py --skip-speed          # digits accuracy only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ensure(work: Path, name: str, source: str, merge: int, check: bool):
    """The bundle (cached in ``work``), exported with --merge-tokens ``merge`` (0: unmerged)."""
    from vitdeploy.bundle import Bundle
    from vitdeploy.exporters import ExportOptions, export

    target = work / name
    if (target / "manifest.json").is_file():
        return Bundle.open(target)
    log(f"exporting {source} --merge-tokens {merge} -> {target} ...")
    options = ExportOptions(random_init=source.startswith("timm:"), merge_tokens=str(merge) if merge else None,
                            check=check, check_images=4)
    started = time.perf_counter()
    bundle = export(source, target, options, log=lambda _m: None)
    log(f"  exported in {time.perf_counter() - started:.0f} s")
    return bundle


def speed(args: argparse.Namespace, work: Path) -> dict:
    from vitdeploy.costs import merge_costs
    from vitdeploy.runtime.ort import OrtRunner

    bundles = {r: ensure(work, f"vitb_r{r}", args.source, r, check=args.check) for r in args.r}
    spec = bundles[args.r[0]].spec
    runners = {r: OrtRunner(b.artifact_path("fp32"), threads=args.threads) for r, b in bundles.items()}
    results = {}
    for batch in args.batch:
        images = np.random.default_rng(0).integers(0, 256, (batch, 224, 224, 3), dtype=np.uint8)
        for runner in runners.values():  # warm-up
            for _ in range(2):
                runner.run({"images": images})
        times: dict[int, list[float]] = {r: [] for r in args.r}
        ratios: dict[int, list[float]] = {r: [] for r in args.r}
        for index in range(args.rounds):
            order = list(args.r) if index % 2 == 0 else list(reversed(args.r))
            medians = {}
            for r in order:
                calls = []
                for _ in range(args.calls):
                    t = time.perf_counter()
                    runners[r].run({"images": images})
                    calls.append(time.perf_counter() - t)
                medians[r] = statistics.median(calls)
                times[r].extend(calls)
            for r in args.r:
                ratios[r].append(medians[0] / medians[r])
            log(f"batch {batch} round {index + 1}/{args.rounds}: " + ", ".join(f"r={r} {medians[r] * 1e3:.0f} ms" for r in args.r))
        rows = []
        for r in args.r:
            predicted = merge_costs(spec, (r,) * spec.depth, 224, 224, batch).predicted_speedup
            measured = statistics.median(ratios[r])
            rows.append({"r": r, "median_ms": round(statistics.median(times[r]) * 1e3, 1),
                         "min_ms": round(min(times[r]) * 1e3, 1), "ratio_median": round(measured, 3),
                         "ratio_min": round(min(ratios[r]), 3), "ratio_max": round(max(ratios[r]), 3),
                         "predicted": round(predicted, 3), "measured_over_predicted": round(measured / predicted, 3)})
        results[f"batch{batch}"] = rows
    for runner in runners.values():
        runner.close()
    return results


def price(args: argparse.Namespace, work: Path) -> list[dict]:
    from vitdeploy.compare import topk_agreement
    from vitdeploy.data import open_labelled
    from vitdeploy.runtime.ort import OrtRunner

    bundles = {r: ensure(work, f"digits_r{r}", "builtin:digits", r, check=True) for r in [0] + list(args.digits_r)}
    base = bundles[0]
    data = open_labelled("digits:test", base.spec.image_size, base.preprocessing, classes=base.labels)
    logits = {}
    for r, bundle in bundles.items():
        runner = OrtRunner(bundle.artifact_path("fp32"), threads=args.threads)
        logits[r] = np.concatenate([runner.run({"images": data.images[i:i + 64]})["logits"] for i in range(0, len(data.images), 64)])
        runner.close()
    rows = []
    for r, out in logits.items():
        rows.append({"r": r, "tokens_out": (bundles[r].manifest.get("token_merge") or {}).get("tokens_per_block", [None])[-1],
                     "accuracy": round(float((out.argmax(1) == data.labels).mean()), 4),
                     "agreement_with_unmerged": round(float(topk_agreement(logits[0], out, 1)), 4), "images": int(len(data.labels))})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="timm:vit_base_patch16_224")
    parser.add_argument("--r", type=lambda s: [int(v) for v in s.split(",")], default=[0, 4, 8, 13])
    parser.add_argument("--batch", type=lambda s: [int(v) for v in s.split(",")], default=[1, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per graph per round")
    parser.add_argument("--threads", type=int, default=None, help="ORT intra-op threads (default: every CPU)")
    parser.add_argument("--digits-r", type=lambda s: [int(v) for v in s.split(",")], default=[2, 4, 8])
    parser.add_argument("--check", action="store_true", help="verify the ViT-B exports against PyTorch (slow)")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--work", default="/tmp/bench_token_merge")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.r[0] != 0:
        parser.error("--r must start with 0 (the unmerged graph every ratio is taken against)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    report = {"load_before": os.getloadavg(), "cpus": os.cpu_count()}
    if not args.skip_speed:
        report["speed"] = speed(args, work)
    report["digits"] = price(args, work)
    report["load_after"] = os.getloadavg()
    for key, rows in report.get("speed", {}).items():
        print(f"\n{args.source} 224x224 {key}, ONNX Runtime CPU, {args.rounds} interleaved rounds x {args.calls} calls")
        print("   r  median ms   ratio (median, range over rounds)   cost model   measured/predicted")
        for row in rows:
            print(f"{row['r']:>4}  {row['median_ms']:>9}   {row['ratio_median']:.3f} [{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]"
                  f"{'':>16}{row['predicted']:.3f}        {row['measured_over_predicted']:.3f}")
    print("\ndigits:test (fp32 graphs): accuracy, and top-1 agreement with the unmerged graph")
    for row in report["digits"]:
        print(f"  r={row['r']:<2} tokens out {row['tokens_out']}: accuracy {row['accuracy']:.2%}, agreement {row['agreement_with_unmerged']:.2%}")
    print(f"load average before {report['load_before']}, after {report['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
