#!/usr/bin/env python
"""Benchmarks for `vitdeploy evaluate`.

    # wall time of the default suite (every graph of the bundle + the PyTorch reference), N runs:
    python bench/bench_evaluate.py time demo-bundle --runs 3              # the CLI's default scheduling
    python bench/bench_evaluate.py time demo-bundle --runs 3 --threads 1
    python bench/bench_evaluate.py time demo-bundle --runs 2 -- --ladder fine   # options after -- go to evaluate
    # two digits models (plain vs Mixup-trained) under the same suite: the ship decision
    python bench/bench_evaluate.py compare plain/reports/evaluate.json mixup/reports/evaluate.json

`time` runs the CLI end to end in a fresh process per run (imports, data, sessions, transforms,
inference, reports) and prints the range over runs, the stage breakdown of the fastest run (from
the report's ``timing``) and the load average, because this machine is shared.

`compare` reads two evaluate.json reports of the same data and suite and prints, per transform,
the mean accuracy over its severities for the chosen scorer (default ``onnx fp32``), the clean
accuracy with its interval, and the rule's verdict: the second model is worth shipping only if it
is at least as accurate clean AND more accurate under shift (mean over every shift condition).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def time_suite(args: argparse.Namespace) -> None:
    exe = str(Path(sys.executable).with_name("vitdeploy"))
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as out:
            threads = ["--threads", str(args.threads)] if args.threads else []  # none: the CLI's own default
            cmd = [exe, "evaluate", args.bundle, *threads, "--no-plot", "--json", "-o", out, *args.extra]
            load = os.getloadavg()[0]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            if proc.returncode != 0:
                sys.exit(f"run {i + 1} failed: {proc.stderr.strip()}")
            report = json.loads(proc.stdout)
            runs.append({"wall_s": wall, "cpu_s": cpu, "load_before": load, "load_after": os.getloadavg()[0], "timing": report["timing"],
                         "conditions": len(report["conditions"]), "scorers": [s["id"] for s in report["scorers"] if not s.get("skipped")],
                         "images": report["data"]["count"]})
            print(f"run {i + 1}: {wall:.1f} s wall, {cpu:.1f} s CPU (load {load:.1f} -> {runs[-1]['load_after']:.1f})", flush=True)
    walls = [r["wall_s"] for r in runs]
    best = min(runs, key=lambda r: r["wall_s"])
    t = best["timing"]
    print(f"\n{best['images']} images x {best['conditions']} conditions x {len(best['scorers'])} scorers ({', '.join(best['scorers'])})")
    cpus = [r["cpu_s"] for r in runs]
    print(f"CPU time (user + sys of the process): {min(cpus):.1f}-{max(cpus):.1f} s")
    print(f"wall: {min(walls):.1f}-{max(walls):.1f} s over {len(walls)} runs; load average {min(r['load_before'] for r in runs):.1f}-"
          f"{max(r['load_after'] for r in runs):.1f} on {os.cpu_count()} CPUs")
    inner = t["total_s"]
    print(f"fastest run: process {best['wall_s']:.1f} s = start-up/imports {best['wall_s'] - inner:.1f} s + evaluate {inner:.1f} s")
    print(f"  data {t['data_s']:.1f} s, sessions + reference model {t['load_s']:.1f} s, transforms {t['transforms_s']:.1f} s")
    for scorer, seconds in t["inference_s"].items():
        print(f"  inference {scorer}: {seconds:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2))


def compare(args: argparse.Namespace) -> None:
    a, b = (json.loads(Path(p).read_text()) for p in (args.first, args.second))
    if a["data"]["sha256"] != b["data"]["sha256"]:
        sys.exit("the two reports scored different data; compare reports of the same --data and --limit")
    sa, sb = a["results"][args.scorer], b["results"][args.scorer]
    common = [c["id"] for c in a["conditions"] if c["id"] in sb and c["id"] in sa]
    shift = [c for c in common if c != "clean"]
    transforms = list(dict.fromkeys(c.split("@")[0] for c in shift))
    name_a, name_b = args.names
    print(f"| condition ({args.scorer}) | {name_a} | {name_b} | difference (pt) |")
    print("|---|---:|---:|---:|")

    def ci(r: dict) -> str:
        return f"{r['accuracy'] * 100:.2f}% ({r['ci95'][0] * 100:.1f}-{r['ci95'][1] * 100:.1f})"

    print(f"| clean | {ci(sa['clean'])} | {ci(sb['clean'])} | {(sb['clean']['accuracy'] - sa['clean']['accuracy']) * 100:+.2f} |")
    for t in transforms:
        ids = [c for c in shift if c.split("@")[0] == t]
        ma = sum(sa[c]["accuracy"] for c in ids) / len(ids)
        mb = sum(sb[c]["accuracy"] for c in ids) / len(ids)
        print(f"| {t} (mean of {len(ids)} severities) | {ma * 100:.2f}% | {mb * 100:.2f}% | {(mb - ma) * 100:+.2f} |")
    mean_a = sum(sa[c]["accuracy"] for c in shift) / len(shift)
    mean_b = sum(sb[c]["accuracy"] for c in shift) / len(shift)
    print(f"| **all shift conditions (mean of {len(shift)})** | {mean_a * 100:.2f}% | {mean_b * 100:.2f}% | {(mean_b - mean_a) * 100:+.2f} |")
    clean_ok = sb["clean"]["correct"] >= sa["clean"]["correct"]
    shift_ok = mean_b > mean_a
    print(f"\nship {name_b}: {'yes' if clean_ok and shift_ok else 'no'} (clean at least as good: {clean_ok}; better under shift: {shift_ok})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time")
    t.add_argument("bundle")
    t.add_argument("--runs", type=int, default=3)
    t.add_argument("--threads", type=int, default=None, help="per scorer [default: none given, the CLI's default]")
    t.add_argument("--json", default=None, help="write the runs here")
    c = sub.add_parser("compare")
    c.add_argument("first")
    c.add_argument("second")
    c.add_argument("--scorer", default="onnx fp32")
    c.add_argument("--names", nargs=2, default=["plain", "mixup"])
    # `time B --runs 2 -- --ladder fine`: what follows -- goes to `vitdeploy evaluate` as is
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.extra = extra
    (time_suite if args.cmd == "time" else compare)(args)


if __name__ == "__main__":
    main()
