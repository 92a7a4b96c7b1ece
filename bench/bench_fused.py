"""What the fused CPU graph (model.cpu.onnx, `vitdeploy convert --target cpu`) brings on this CPU.

For each bundle and size, in one process and interleaved rounds (machine drift falls on every runner
alike), batch 1 by default:

* ORT on the plain graph (model.onnx, ORT_ENABLE_ALL: ORT's own session-time fusions),
* ORT on the fused graph (com.microsoft.Attention in place of the exporter's attention subgraph),
* PyTorch eager (vitdeploy's reference runner: the bundle's source model, host preprocessing),

and the GEMM peak probe of the same run (onnxruntime MatMul, n=1024): achieved GFLOP/s = 2 x the
cost model's MACs / p50, and its share of the probe. Ratios are taken within one run.

    python bench/bench_fused.py --bundle vits224 --bundle vits384 --threads 2 --rounds 6 --iters 10 --json out.json
    python bench/bench_fused.py --export timm:vit_small_patch16_224 --sizes 224,384 ...   (exports static bundles first)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _time(fn, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def bench_bundle(path: Path, threads: int, rounds: int, iters: int, batch: int, peak_gflops: float) -> dict:
    from vitdeploy.bundle import Bundle
    from vitdeploy.costs import vit_costs
    from vitdeploy.exporters.torch_runner import TorchRunner
    from vitdeploy.preprocess import random_images
    from vitdeploy.exporters.cpu_fused import add_cpu_graph_to_bundle
    from vitdeploy.runtime.fused import CPU_KEY, cpu_graph_for
    from vitdeploy.runtime.ort import OrtRunner

    bundle = Bundle.open(path)
    if cpu_graph_for(bundle) is None:
        add_cpu_graph_to_bundle(bundle, log=lambda m: print(f"  {m}", flush=True), threads=threads)
        bundle = Bundle.open(path)
    h, w = bundle.resolution["height"], bundle.resolution["width"]
    image = random_images(batch, h, w, seed=3)
    cpu = ["CPUExecutionProvider"]
    runners = {
        "ort_plain": OrtRunner(bundle.artifact_path("fp32"), threads=threads, providers=cpu),
        "ort_fused": OrtRunner(bundle.root / bundle.artifact_record(CPU_KEY)["file"], threads=threads, providers=cpu),
        "torch_eager": TorchRunner.from_bundle(bundle, threads=threads),
    }
    for r in runners.values():
        for _ in range(3):
            r.infer(image)
    samples: dict[str, list[float]] = {k: [] for k in runners}
    for i in range(rounds):
        order = list(runners) if i % 2 == 0 else list(reversed(runners))
        for name in order:
            runners[name].infer(image)  # untimed: re-warm after the other runners
            samples[name] += _time(lambda: runners[name].infer(image), iters)
    p50 = {k: statistics.median(v) for k, v in samples.items()}
    flops = vit_costs(bundle.spec, h, w, batch).flops_total
    result = {
        "bundle": str(path), "size": f"{h}x{w}", "batch": batch, "samples_each": len(samples["ort_plain"]),
        "fusion": bundle.artifact_record(CPU_KEY).get("fusion", {}).get("attention_fused"),
        "p50_ms": {k: round(v, 2) for k, v in p50.items()},
        "range_ms": {k: [round(min(v), 2), round(max(v), 2)] for k, v in samples.items()},
        "fused_vs_torch": round(p50["ort_fused"] / p50["torch_eager"], 3),
        "plain_vs_torch": round(p50["ort_plain"] / p50["torch_eager"], 3),
        "fused_speedup_over_plain": round(p50["ort_plain"] / p50["ort_fused"], 3),
        "achieved_gflops": {k: round(flops / (v / 1e3) / 1e9, 1) for k, v in p50.items()},
    }
    result["peak_share"] = {k: round(v / peak_gflops, 3) for k, v in result["achieved_gflops"].items()}
    for r in runners.values():
        r.close()
    return result


def export_static(source: str, sizes: list[int], work: Path) -> list[Path]:
    from vitdeploy.exporters import ExportOptions, export

    out = []
    for size in sizes:
        target = work / f"bundle{size}"
        export(source, target, ExportOptions(resolution=(size, size), check_images=2,
                                             random_init=source.split(":", 1)[0] in ("timm", "hf")))  # timing: random weights
        out.append(target)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", action="append", type=Path, default=[], help="a bundle (static graph) to measure; repeatable")
    parser.add_argument("--export", help="export this source at each of --sizes first (static, random init for timm)")
    parser.add_argument("--sizes", default="224,384")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from vitdeploy.profile.gemm_probe import probe_onnxruntime

    with tempfile.TemporaryDirectory() as tmp:
        bundles = list(args.bundle)
        if args.export:
            bundles += export_static(args.export, [int(s) for s in args.sizes.split(",")], Path(tmp))
        peak = probe_onnxruntime(args.threads, budget_s=1.0)
        rows = [bench_bundle(b, args.threads, args.rounds, args.iters, args.batch, peak.gflops) for b in bundles]
        peak_after = probe_onnxruntime(args.threads, budget_s=1.0)
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads, "loadavg": os.getloadavg()},
        "gemm_probe_gflops": {"before": round(peak.gflops, 1), "after": round(peak_after.gflops, 1)},
        "rows": rows,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
