"""Does `vitdeploy profile` measure ONNX Runtime, or itself?

Acceptance (issue 7): for ONNX Runtime at batch 1, the profiler's p50 is within 3% of a bare
``session.run`` loop timed in the same process.

Method: one ONNX Runtime session, shared by both paths so that only the measuring code differs.
* profiler path: ``vitdeploy.profile.measure.measure`` driving an OrtRunner wrapper around that
  session (Runner.run's timer, the output dict, the sample list: everything the profile does);
* bare path: ``t = perf_counter(); session.run(...); samples.append(perf_counter() - t)``.
The two alternate in blocks, in ABBA order (A B, B A, A B, ...), so drift (clock boosts, other
processes, thermal) falls on both equally. Each size runs ``--rounds`` x ``--block`` calls per path.

Models: timm ViTs, random init, exported once with a dynamic resolution by vitdeploy's exporter
(cached in --work). ViT-S/16 at 224x224 is the acceptance case; ViT-Ti/16 at 64x64 (L = 17) makes
each call a few milliseconds, so a per-call cost of the profiler would show there first.

    .venv/bin/python bench/bench_profiler_overhead.py                 # ~5 min on 2 cores
    .venv/bin/python bench/bench_profiler_overhead.py --cases timm:vit_small_patch16_224@224 --rounds 40 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from vitdeploy.bundle import Bundle
from vitdeploy.profile.measure import default_threads, measure, summarize
from vitdeploy.runtime.base import Runner
from vitdeploy.runtime.ort import OrtRunner

CASES = "timm:vit_small_patch16_224@224,timm:vit_tiny_patch16_224@64"
LIMIT = 0.03


def ensure_bundle(work: Path, source: str) -> Bundle:
    """Export once with `vitdeploy export` in a child process: this process never loads torch, so
    only ONNX Runtime shares its cores and memory with the measurement."""
    target = work / source.replace(":", "_")
    if not (target / "manifest.json").is_file():
        exe = shutil.which("vitdeploy") or str(Path(sys.executable).parent / "vitdeploy")
        # timing needs no trained weights (and no hub): timm sources with --random-init
        cmd = [exe, "export", source, "-o", str(target), "--dynamic-resolution", "--no-check"] + (["--random-init"] if source.startswith("timm:") else [])
        print("exporting:", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return Bundle.open(target)


class SharedSession(Runner):
    """The profiler's view of an already-loaded OrtRunner: same session, never closed by measure()."""

    def __init__(self, inner: OrtRunner):
        self.inner = inner
        self.info = inner.info

    def inputs(self):  # noqa: ANN201 - delegation
        return self.inner.inputs()

    def outputs(self):  # noqa: ANN201
        return self.inner.outputs()

    def input_names(self):  # noqa: ANN201
        return self.inner.input_names()

    def _execute(self, feeds: dict, outputs: list | None) -> dict[str, np.ndarray]:
        return self.inner._execute(feeds, outputs)  # the runner's own call, timed by Runner.run as in `profile`


def bare_block(session, names: list[str], feed: dict, n: int, out: list[float]) -> None:
    perf = time.perf_counter
    for _ in range(n):
        t = perf()
        session.run(names, feed)
        out.append(perf() - t)


def run_size(runner: OrtRunner, size: int, rounds: int, block: int, warmup: int) -> dict:
    rng = np.random.default_rng(0)
    batch = rng.integers(0, 256, size=(1, size, size, 3), dtype=np.uint8)
    session, names = runner.session, runner.outputs()
    feed = {runner.inputs()[0].name: batch}
    shared = SharedSession(runner)
    for _ in range(warmup):
        session.run(names, feed)
    profiler: list[float] = []
    bare: list[float] = []
    for r in range(rounds):
        order = ("profiler", "bare") if r % 2 == 0 else ("bare", "profiler")
        for path in order:
            if path == "profiler":
                m = measure(lambda: shared, batch, warmup=0, iterations=block)
                profiler.extend(m.samples_s)
            else:
                bare_block(session, names, feed, block, bare)
    p, b = summarize(profiler), summarize(bare)
    diff = p.p50_s / b.p50_s - 1
    return {
        "size": size,
        "calls_per_path": p.n,
        "profiler_p50_ms": p.p50_s * 1e3,
        "bare_p50_ms": b.p50_s * 1e3,
        "p50_diff": diff,
        "profiler_p90_ms": p.p90_s * 1e3,
        "bare_p90_ms": b.p90_s * 1e3,
        "profiler_cv": p.cv,
        "bare_cv": b.cv,
        "within_limit": abs(diff) <= LIMIT,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/vitdeploy-bench"), help="where the exported bundle is cached")
    ap.add_argument("--cases", default=CASES, help="comma-separated SOURCE@SIZE (square inputs, multiples of the patch)")
    ap.add_argument("--rounds", type=int, default=100, help="ABBA rounds")
    ap.add_argument("--block", type=int, default=5, help="calls per path per round (small blocks cancel drift best)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()

    threads = args.threads or default_threads()
    load_start = list(os.getloadavg())
    results = []
    for case in args.cases.split(","):
        source, _, size_text = case.rpartition("@")
        size = int(size_text)
        bundle = ensure_bundle(args.work, source)
        bundle.spec.grid(size, size)
        runner = OrtRunner(bundle.artifact_path("fp32"), threads=threads, providers=["CPUExecutionProvider"])
        res = {"source": source, **run_size(runner, size, args.rounds, args.block, args.warmup)}
        runner.close()
        results.append(res)
        print(f"{source} {size}x{size}: profiler p50 {res['profiler_p50_ms']:.3f} ms, bare p50 {res['bare_p50_ms']:.3f} ms, "
              f"diff {res['p50_diff']:+.2%} ({'ok' if res['within_limit'] else 'OVER'} the {LIMIT:.0%} limit); "
              f"CV {res['profiler_cv']:.1%} / {res['bare_cv']:.1%}", flush=True)

    import onnxruntime as ort

    from vitdeploy.profile.sweep import machine_info

    report = {
        "bench": "profiler_overhead",
        "onnxruntime": ort.__version__,
        "threads": threads,
        "rounds": args.rounds,
        "block": args.block,
        "machine": {k: v for k, v in machine_info(threads, ["ort"], []).items() if k in ("cpu", "cpu_count", "platform", "loadavg")},
        "loadavg_start": load_start,
        "results": results,
    }
    print(f"\nload average at the start: {load_start}, at the end: {report['machine'].get('loadavg')}")
    print("| model | input | calls/path | profiler p50 (ms) | bare session.run p50 (ms) | difference | within 3% |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['source']} | {r['size']}x{r['size']} | {r['calls_per_path']} | {r['profiler_p50_ms']:.3f} | {r['bare_p50_ms']:.3f} | "
              f"{r['p50_diff']:+.2%} | {'yes' if r['within_limit'] else 'no'} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["within_limit"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
