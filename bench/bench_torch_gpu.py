"""The PyTorch baseline held against bare PyTorch, in one run (issue 14).

For each model, resolution, batch and torch mode it times

* the cell `vitdeploy profile --backend torch --torch-mode MODE` produces (exporters/torch_fast.py:
  uint8 in, normalisation on the device, the model, softmax, outputs back on the host), and
* a bare PyTorch loop on the same weights: the model alone on an input already normalised on the
  device, `inference_mode`, the same mode (eager call, CUDA-graph replay, `torch.compile`),

and reports both p50s (host wall time, and CUDA-event device time on a GPU), their ratio, and the
device memory the profile cell held. The acceptance of issue 14 is checked at the end: ViT-B/16@224
batch 8 fp16, cuda-graph and eager cells within 1.2x of their bare loops, gpu_mem_mb > 150.

    python bench/bench_torch_gpu.py                                  # GPU: the issue's table (~4-5 min on an H200)
    python bench/bench_torch_gpu.py --device cpu --precision fp32 --models vit_tiny_patch16_224 \\
        --resolutions 224 --batch 1 --modes eager --iterations 10   # the same code path on a CPU

Bundles are exported (random init, dynamic resolution) by the vitdeploy CLI in child processes and
cached in --work; random weights are fine, latency does not depend on them. `compile` compiles
once per shape on both sides (tens of seconds each), so by default it runs only where the
acceptance looks (--compile-models/--compile-resolutions/--compile-batches).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vit_sweep import ensure_bundle  # noqa: E402  (export via the CLI, cached)

from vitdeploy.profile import SweepConfig, profile_bundle  # noqa: E402
from vitdeploy.profile.report import to_json  # noqa: E402

ACCEPT_RATIO = 1.2
ACCEPT_MEM_MB = 150.0


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def bare_loop(model: Any, x: Any, mode: str, iterations: int, warmup: int, cuda: bool) -> dict[str, float]:
    """What a PyTorch user times: the model on a normalised device tensor, nothing else."""
    import torch

    with torch.inference_mode():
        if mode == "eager":
            def step() -> Any:
                return model(x)
        elif mode == "compile":
            compiled = torch.compile(model, dynamic=False)

            def step() -> Any:
                return compiled(x)
        elif mode == "cuda-graph":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model(x)
            step = graph.replay
        else:
            raise ValueError(mode)
        t0 = time.perf_counter()
        step()  # first call: compilation / lazy initialisation, reported as start-up
        if cuda:
            torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        for _ in range(warmup):
            step()
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host, device = [], []
        for _ in range(iterations):
            t0 = time.perf_counter()
            if cuda:
                start.record()
            step()
            if cuda:
                end.record()
                torch.cuda.synchronize()
                device.append(start.elapsed_time(end))
            host.append((time.perf_counter() - t0) * 1e3)
    return {"p50_ms": statistics.median(host), "device_p50_ms": statistics.median(device) if device else None, "first_call_s": first_s}


def bare_cells(bundle: Any, resolutions: list[int], batches: list[int], modes_for: Any, args: argparse.Namespace) -> dict[tuple, dict]:
    import numpy as np
    import torch

    from vitdeploy.exporters.api import loaded_for_bundle
    from vitdeploy.preprocess import normalise

    cuda = args.device == "cuda"
    out: dict[tuple, dict] = {}
    for res in resolutions:
        model = loaded_for_bundle(bundle, (res, res)).model.eval()
        if args.precision == "fp16":
            model = model.half()
        model = model.to(args.device)
        for batch in batches:
            pixels = np.random.default_rng(0).integers(0, 256, (batch, res, res, 3), dtype=np.uint8)
            x = torch.from_numpy(normalise(pixels, bundle.preprocessing)).to(args.device, torch.float16 if args.precision == "fp16" else torch.float32)
            for mode in modes_for(res, batch):
                if mode == "cuda-graph" and not cuda:
                    continue
                out[(res, batch, mode)] = bare_loop(model, x, mode, args.iterations, args.warmup, cuda)
                print(f"  bare {mode:10s} {res} b{batch}: p50 {out[(res, batch, mode)]['p50_ms']:.3f} ms", flush=True)
        del model
        if cuda:
            torch.cuda.empty_cache()
    return out


def run_model(name: str, args: argparse.Namespace) -> list[dict]:
    bundle = ensure_bundle(args.work, f"timm:{name}", ["fp32"], "")
    resolutions = [int(r) for r in _csv(args.resolutions)]
    batches = [int(b) for b in _csv(args.batch)]
    modes = _csv(args.modes)
    plain = [m for m in modes if m != "compile"]
    compile_here = "compile" in modes and name in _csv(args.compile_models)
    c_res = [r for r in resolutions if str(r) in _csv(args.compile_resolutions)]
    c_batch = [b for b in batches if str(b) in _csv(args.compile_batches)]
    if args.device == "cpu":
        plain = [m for m in plain if m != "cuda-graph"]

    cells: dict[tuple, dict] = {}
    gpu_name = None
    sweeps = []
    if plain:
        sweeps.append((resolutions, batches, plain))
    if compile_here and c_res and c_batch:
        sweeps.append((c_res, c_batch, ["compile"]))
    for res_list, batch_list, mode_list in sweeps:
        config = SweepConfig(resolutions=[(r, r) for r in res_list], batches=batch_list, precisions=[args.precision], backends=["torch"],
                             torch_modes=mode_list, iterations=args.iterations, warmup=args.warmup, device=args.device)
        outcome = profile_bundle(bundle.root, config, out_dir=args.work / f"reports-{name}-{'-'.join(mode_list)}", plot=False)
        report = to_json(outcome.result)
        for row in report["cells"]:
            cells[(row["height"], row["batch"], _requested_mode(row))] = row
        gpu_name = report["machine"].get("gpu")

    def modes_for(res: int, batch: int) -> list[str]:
        wanted = list(plain)
        if compile_here and res in c_res and batch in c_batch:
            wanted.append("compile")
        return wanted

    bare = bare_cells(bundle, resolutions, batches, modes_for, args)
    rows = []
    for (res, batch, mode), yard in sorted(bare.items()):
        cell = cells.get((res, batch, mode), {})
        ok = cell.get("status") == "ok"
        rows.append({
            "model": name, "gpu": gpu_name, "precision": args.precision, "size": res, "batch": batch, "mode": mode,
            "status": cell.get("status"), "note": cell.get("note"), "ran": cell.get("torch_mode"),
            "profile_p50_ms": cell.get("p50_ms") if ok else None, "bare_p50_ms": yard["p50_ms"],
            "ratio": cell["p50_ms"] / yard["p50_ms"] if ok else None,
            "profile_device_p50_ms": cell.get("device_p50_ms") if ok else None, "bare_device_p50_ms": yard["device_p50_ms"],
            "device_ratio": (cell["device_p50_ms"] / yard["device_p50_ms"]) if ok and cell.get("device_p50_ms") and yard["device_p50_ms"] else None,
            "gpu_mem_mb": cell.get("gpu_mem_mb"), "profile_startup_s": cell.get("startup_s"), "bare_first_call_s": yard["first_call_s"],
            "cv": cell.get("cv"),
        })
    return rows


def _requested_mode(row: dict) -> str:
    """The profile's graph column says what was asked for ("timm:x (torch cuda-graph)")."""
    graph = row.get("graph") or ""
    return graph.rsplit("(torch ", 1)[-1].rstrip(")") if "(torch " in graph else (row.get("torch_mode") or "auto")


def acceptance(rows: list[dict]) -> list[dict]:
    """Issue 14's three checks, on ViT-B/16@224 batch 8 fp16; absent cells say so."""
    def find(mode: str) -> dict | None:
        return next((r for r in rows if r["model"] == "vit_base_patch16_224" and r["size"] == 224 and r["batch"] == 8
                     and r["mode"] == mode and r["precision"] == "fp16"), None)

    checks = []
    for mode in ("cuda-graph", "eager"):
        r = find(mode)
        ratio = r["ratio"] if r else None
        checks.append({"check": f"ViT-B/16@224 b8 fp16 {mode}: profile p50 within {ACCEPT_RATIO}x of bare {mode}",
                       "value": ratio, "holds": None if r is None else (ratio is not None and ratio <= ACCEPT_RATIO)})
    cell = find("cuda-graph") or find("eager")
    mem = cell.get("gpu_mem_mb") if cell else None
    checks.append({"check": f"ViT-B/16 fp16 gpu_mem_mb > {ACCEPT_MEM_MB:.0f}", "value": mem,
                   "holds": None if cell is None else (mem is not None and mem > ACCEPT_MEM_MB)})
    return checks


def markdown(rows: list[dict], checks: list[dict], meta: dict) -> str:
    def f(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    lines = [f"GPU: {meta.get('gpu') or 'none'}; torch {meta['torch']}; {meta['precision']}; {meta['iterations']} timed calls per cell; "
             f"wall {meta['wall_s']:.0f} s", "",
             "| model | size | batch | mode | profile p50 ms | bare p50 ms | ratio | profile device ms | bare device ms | device ratio | gpu_mem_mb |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['model']} | {r['size']} | {r['batch']} | {r['mode']} | {r['status']}: {r['note']} | {f(r['bare_p50_ms'], '.3f')} | | | | | |")
            continue
        lines.append(f"| {r['model']} | {r['size']} | {r['batch']} | {r['mode']} | {f(r['profile_p50_ms'], '.3f')} | {f(r['bare_p50_ms'], '.3f')} | "
                     f"{f(r['ratio'], '.2f')} | {f(r['profile_device_p50_ms'], '.3f')} | {f(r['bare_device_p50_ms'], '.3f')} | "
                     f"{f(r['device_ratio'], '.2f')} | {f(r['gpu_mem_mb'], '.0f')} |")
    lines += ["", "Acceptance (issue 14):"]
    for c in checks:
        verdict = "not run (no such cell in this run)" if c["holds"] is None else ("holds" if c["holds"] else "DOES NOT HOLD")
        lines.append(f"- {c['check']}: {f(c['value'], '.2f')} -> {verdict}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/vitdeploy-bench"), help="bundles and reports are kept here")
    ap.add_argument("--models", default="vit_small_patch16_224,vit_base_patch16_224")
    ap.add_argument("--resolutions", default="224,384")
    ap.add_argument("--batch", default="1,8,64")
    ap.add_argument("--modes", default="eager,cuda-graph,compile")
    ap.add_argument("--compile-models", default="vit_base_patch16_224")
    ap.add_argument("--compile-resolutions", default="224")
    ap.add_argument("--compile-batches", default="1,8")
    ap.add_argument("--precision", default="fp16", choices=["fp16", "fp32"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", type=Path, default=None, help="write rows, acceptance and machine here")
    ap.add_argument("--markdown", type=Path, default=None, help="write the table here")
    args = ap.parse_args()

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch: the GPU table was not run (use --device cpu for the CPU path)", file=sys.stderr)
        return 2
    if args.precision == "fp16" and args.device == "cpu":
        print("fp16 is the GPU baseline; on the CPU use --precision fp32", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows: list[dict] = []
    for name in _csv(args.models):
        print(f"== {name}", flush=True)
        rows += run_model(name, args)
    checks = acceptance(rows)
    meta = {"gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "torch": torch.__version__,
            "precision": args.precision, "iterations": args.iterations, "wall_s": time.perf_counter() - start, "device": args.device}
    table = markdown(rows, checks, meta)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows, "acceptance": checks}, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
