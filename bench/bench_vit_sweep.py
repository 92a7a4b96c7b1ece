"""The issue-7 sweep: ViT-S/16 (timm, random init, dynamic-resolution export) over 4 resolutions x
2 batch sizes x 2 precisions on ONNX Runtime, on this machine; the plot goes to docs/img/.

    .venv/bin/python bench/bench_vit_sweep.py                        # CPU sweep (~5-15 min on 2 cores)
    .venv/bin/python bench/bench_vit_sweep.py --precision fp32,fp16  # the precisions to compare

The cells are timed interleaved (--rounds): all 16 sessions are loaded, then each round runs a
few calls of every cell, forward and backward in turn, so other processes on a shared machine
slow every cell alike instead of whichever cell was running at the time.

The bundle is exported once with vitdeploy's exporter and cached in --work. A second precision is
made by vitdeploy's own steps: fp16 by the exporter's precision pass, int8 by `vitdeploy calibrate`
(its arguments: --calibrate-args). Random weights are fine here: latency does not depend on them.

Where CUDA is available (torch sees a GPU) it also records the torch-CUDA backend for ViT-S/16 and
ViT-B/16 at 224 and 384, fp16, batch 1 and 8 (the issue's GPU table), with the GPU's name; on a
machine without a GPU that part is skipped and says so. The torch cells run the profile's default
`--torch-mode auto`; the per-mode comparison with bare PyTorch loops is bench/bench_torch_gpu.py.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from vitdeploy.bundle import Bundle
from vitdeploy.profile import SweepConfig, profile_bundle
from vitdeploy.profile.report import to_json

REPO = Path(__file__).resolve().parents[1]
IMG = REPO / "docs" / "img"


def _vitdeploy(*args: str) -> None:
    exe = shutil.which("vitdeploy") or str(Path(sys.executable).parent / "vitdeploy")
    cmd = [exe, *args]
    print("running:", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, check=False)
    if done.returncode != 0:
        sys.exit(f"`{' '.join(cmd)}` failed (exit {done.returncode})")


def random_init_flag(source: str) -> list[str]:
    """Timing needs no trained weights (they don't change the arithmetic) and no hub: timm/hf sources
    are exported with --random-init (the bundles say so)."""
    return ["--random-init"] if source.split(":", 1)[0] in ("timm", "hf") else []


def ensure_bundle(work: Path, source: str, precisions: list[str], calibrate_args: str) -> Bundle:
    """Export (and calibrate) with the vitdeploy CLI in child processes: the measuring process never
    loads torch, so its memory and cores hold only what the profile measures."""
    target = work / source.replace(":", "_")
    bundle = Bundle.open(target) if (target / "manifest.json").is_file() else None
    want_fp16 = "fp16" in precisions
    if bundle is None or (want_fp16 and "fp16" not in bundle.precisions()):
        _vitdeploy("export", source, "-o", str(target), "--dynamic-resolution", "--no-check",
                   *random_init_flag(source),
                   "--precision", "fp32,fp16" if want_fp16 else "fp32")
        bundle = Bundle.open(target)
    if "int8" in precisions and "int8" not in bundle.precisions():
        _vitdeploy("calibrate", str(target), *shlex.split(calibrate_args))
        bundle = Bundle.open(target)
    return bundle


def cpu_sweep(args: argparse.Namespace) -> dict:
    precisions = [p for p in args.precision.split(",") if p]
    bundle = ensure_bundle(args.work, args.source, precisions, args.calibrate_args)
    out = args.work / "reports-cpu"
    config = SweepConfig(
        resolutions=[(int(r), int(r)) for r in args.resolutions.split(",")],
        batches=[int(b) for b in args.batch.split(",")],
        precisions=precisions,
        backends=["ort"],
        iterations=args.iterations,
        rounds=args.rounds or None,
        warmup=args.warmup,
        threads=args.threads,
        device="cpu",
    )
    from vitdeploy.console import get_console

    outcome = profile_bundle(bundle.root, config, out_dir=out, plot=True, progress_console=get_console(stderr=True))
    IMG.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(outcome.paths["png"], IMG / "profile_vit_s16_cpu.png")
    report = to_json(outcome.result)
    print_table(report)
    return report


def gpu_sweep(args: argparse.Namespace) -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: the torch-CUDA table (ViT-S/16, ViT-B/16 at 224/384, fp16) was not run", flush=True)
        return []
    reports = []
    for source in ("timm:vit_small_patch16_224", "timm:vit_base_patch16_224"):
        bundle = ensure_bundle(args.work, source, ["fp32"], "")
        config = SweepConfig(resolutions=[(224, 224), (384, 384)], batches=[1, 8], precisions=["fp16"], backends=["torch"],
                             iterations=args.gpu_iterations, warmup=args.warmup, device="cuda")
        outcome = profile_bundle(bundle.root, config, out_dir=args.work / f"reports-cuda-{source.split(':')[1]}", plot=True)
        shutil.copyfile(outcome.paths["png"], IMG / f"profile_{source.split(':')[1]}_torch_cuda.png")
        report = to_json(outcome.result)
        print_table(report)
        reports.append(report)
    return reports


def print_table(report: dict) -> None:
    m = report["machine"]
    print(f"\n{report['bundle']['name']} on {m.get('gpu') or m.get('cpu')} ({m['threads']} threads, load {m.get('loadavg')})")
    print("| backend | precision | size | batch | p50 ms | p90 ms | CV | img/s | GMAC/call | GFLOP/s | % of GEMM peak | attention share | start-up s | RSS added MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in report["cells"]:
        if c["status"] != "ok":
            print(f"| {c['backend']} | {c['precision']} | {c['height']} | {c['batch']} | {c['status']}: {c['note']} |")
            continue
        print(f"| {c['backend']} | {c['precision']} | {c['height']} | {c['batch']} | {c['p50_ms']:.1f} | {c['p90_ms']:.1f} | "
              f"{c['cv']:.1%}{' (unstable)' if c['unstable'] else ''} | {c['throughput_ips']:.2f} | {c['macs'] / 1e9:.2f} | "
              f"{c['achieved_gflops']:.1f} | {c['peak_share']:.0%} | {c['attention_share']:.1%} | {c['startup_s']:.2f} | "
              f"{c['rss_added_mb']:.0f} |")
    peaks = ", ".join(f"{p['library']} {p['gflops']:.0f} GFLOP/s" for p in report["peaks"])
    print(f"GEMM peak probes: {peaks}; attention/MLP crossover L = {report['cost_model']['crossover_seq_len']:.0f}")
    rss = max((c["peak_rss_mb"] for c in report["cells"] if c.get("peak_rss_mb")), default=None)
    if rss is not None:
        print(f"peak RSS of the process: {rss:.0f} MiB ({report['cells'][0].get('rss_scope')} scope); wall {report['wall_s']:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/vitdeploy-bench"), help="bundles and reports are kept here")
    ap.add_argument("--source", default="timm:vit_small_patch16_224")
    ap.add_argument("--resolutions", default="160,224,288,384")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--precision", default="fp32,int8")
    ap.add_argument("--calibrate-args", default="", help="extra arguments for `vitdeploy calibrate` when int8 is asked for")
    ap.add_argument("--iterations", type=int, default=20, help="timed calls per cell")
    ap.add_argument("--rounds", type=int, default=10,
                    help="interleave the cells over this many rounds (0: one cell after the other); fair on a shared machine")
    ap.add_argument("--gpu-iterations", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--skip-cpu", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write every report here")
    args = ap.parse_args()

    reports = [] if args.skip_cpu else [cpu_sweep(args)]
    reports += gpu_sweep(args)
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
