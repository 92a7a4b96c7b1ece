"""Export benchmarks (issue: export): which exporter, and what the exported graph buys on a CPU.

1. TorchScript-based vs dynamo exporter on timm ViT-S/16 (random init) with the uint8 preprocessing
   wrapper: export time, node count and op types (one LayerNormalization per LN? Gelu?), whether the
   graph runs at another resolution, and ORT latency.
2. ONNX Runtime (CPU, N threads, batch 1) latency of the exported ViT-S/16 at 224 vs PyTorch eager
   doing the same preprocessing and forward, measured side by side (interleaved rounds).
3. (issue 15, ``--scale``) the export at real model sizes, as a user runs it: ``vitdeploy export
   timm:NAME -o DIR --dynamic-resolution`` under ``/usr/bin/time -v`` (wall time, peak RSS) with its
   log (the verification plan and per-size PyTorch/ORT seconds), and each export step on its own in
   this process (wall time and peak RSS per step, the high-water mark reset before each: source,
   dynamo export, onnxslim, writing; onnxslim's graph is then gated by the verification the CLI
   line runs, so a verified export has no separate identity check).

4. (issue 32, ``--large``) the largest ViTs, one command after the other as a user runs them, each
   under ``/usr/bin/time -v``: ``vitdeploy export timm:NAME -o DIR --dynamic-resolution`` (random
   weights: ``--random-init`` where the export has that option), ``vitdeploy convert DIR --precision
   fp16`` and ``vitdeploy calibrate DIR --data digits:train --samples 16 --method minmax``: seconds,
   peak RSS, the graph's and its data file's sizes, the verification's max |d|, the load average
   before and after, and the memory available before each (a step is skipped below --min-free-gb).

    python bench/bench_export.py --threads 2 --rounds 5 --iters 20 --json out.json
    python bench/bench_export.py --scale vit_small_patch14_dinov2 --scale vit_base_patch16_224 --json scale.json
    python bench/bench_export.py --large vit_large_patch16_224 --large vit_huge_patch14_224 --json large.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import onnx
import onnxruntime as ort
import torch

from vitdeploy.exporters import ExportOptions, export
from vitdeploy.exporters.graph import DeployGraph
from vitdeploy.exporters.sources import load_source
from vitdeploy.preprocess import random_images


def ort_session(path: str, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])


def time_calls(fn, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def compare_exporters(model_name: str, threads: int, rounds: int, iters: int, work: Path) -> dict:
    torch.manual_seed(0)
    loaded = load_source(f"timm:{model_name}", random_init=True)
    module = DeployGraph(loaded.model, loaded.preprocessing).eval()
    example = torch.from_numpy(random_images(1, 224, 224))
    results, sessions = {}, {}
    for name, dynamo in (("torchscript", False), ("dynamo", True)):
        path = work / f"{name}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            kwargs = {"dynamo": dynamo, "opset_version": 20 if dynamo else 17, "input_names": ["images"], "output_names": ["logits", "probs"]}
            if dynamo:
                kwargs["dynamic_shapes"] = {"images": {0: torch.export.Dim.DYNAMIC}}
            else:
                kwargs["dynamic_axes"] = {"images": {0: "batch"}}
            torch.onnx.export(module, (example,), str(path), **kwargs)
            seconds = time.perf_counter() - t0
        model = onnx.load(str(path))
        ops = Counter(n.op_type for n in model.graph.node)
        sessions[name] = ort_session(str(path), threads)
        results[name] = {
            "export_s": round(seconds, 2),
            "nodes": len(model.graph.node),
            "LayerNormalization": ops.get("LayerNormalization", 0),
            "Gelu": ops.get("Gelu", 0),
            "Erf": ops.get("Erf", 0),
        }
    image = random_images(1, 224, 224, seed=1)
    latencies: dict[str, list[float]] = {name: [] for name in sessions}
    for sess in sessions.values():
        for _ in range(5):
            sess.run(None, {"images": image})
    for _ in range(rounds):  # interleaved rounds: machine drift falls on both graphs alike
        for name, sess in sessions.items():
            latencies[name] += time_calls(lambda: sess.run(None, {"images": image}), iters)
    for name in sessions:
        results[name]["ort_p50_ms"] = round(statistics.median(latencies[name]), 3)
    return results


def ort_vs_torch(model_name: str, threads: int, rounds: int, iters: int, work: Path) -> dict:
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    bundle = export(f"timm:{model_name}", work / "bundle", ExportOptions(check_images=8, random_init=True))
    export_s = time.perf_counter() - t0
    sess = ort_session(str(bundle.artifact_path("fp32")), threads)
    loaded = load_source(f"timm:{model_name}", random_init=True)
    model = loaded.model.eval()
    mean = torch.tensor(loaded.preprocessing["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(loaded.preprocessing["std"]).view(1, 3, 1, 1)
    image = random_images(1, 224, 224, seed=2)

    @torch.no_grad()
    def eager():
        x = torch.from_numpy(image).permute(0, 3, 1, 2).float() / 255.0
        logits = model((x - mean) / std)
        return torch.softmax(logits, -1)

    for _ in range(5):
        sess.run(None, {"images": image})
        eager()
    ort_ms, torch_ms = [], []
    for _ in range(rounds):  # interleaved, so drift in machine load hits both alike
        ort_ms += time_calls(lambda: sess.run(None, {"images": image}), iters)
        torch_ms += time_calls(eager, iters)
    p50_o, p50_t = statistics.median(ort_ms), statistics.median(torch_ms)
    return {"export_s_with_check": round(export_s, 1), "ort_p50_ms": round(p50_o, 2), "torch_eager_p50_ms": round(p50_t, 2),
            "speedup": round(p50_t / p50_o, 2), "samples_each": len(ort_ms)}


def export_steps(model_name: str) -> dict:
    """Each step of a dynamic-resolution export of timm:``model_name`` (random init), in this process."""
    import gc

    from vitdeploy.exporters import api
    from vitdeploy.exporters.onnx_export import export_graph, run_onnxslim, strip_trace_metadata
    from vitdeploy.profile.measure import current_rss_mb, peak_rss_mb, reset_peak_rss

    steps: dict[str, dict] = {}
    t0 = time.perf_counter()
    reset_peak_rss()

    def mark(name: str) -> None:
        nonlocal t0
        now = time.perf_counter()
        steps[name] = {"s": round(now - t0, 2), "peak_rss_mb": round(peak_rss_mb()), "rss_after_mb": round(current_rss_mb() or 0)}
        gc.collect()
        reset_peak_rss()
        t0 = time.perf_counter()

    torch.manual_seed(0)
    opts = ExportOptions(dynamic_resolution=True, random_init=True)
    loaded = load_source(f"timm:{model_name}", random_init=True)
    variant, resolution = api._variant(loaded, opts)
    mark("load source (timm.create_model, random init)")
    pre = api._preprocessing_contract(loaded, opts, resolution)
    h, w = resolution["height"], resolution["width"]
    module = DeployGraph(variant.model, pre, "uint8-nhwc", None).eval()
    proto, _ = export_graph(module, api._example(opts, h, w, variant.spec.patch_size), dynamic_hw=True)
    strip_trace_metadata(proto)
    mark("torch.onnx.export (dynamo)")
    # the export's own step: onnxslim as a verified export calls it (the verification is its gate)
    slim, record = run_onnxslim(proto)
    slim = slim if slim is not None else proto
    step = "onnxslim"
    mark(step)
    steps[step].update({"slim_s": record.get("slim_s"), "applied": record.get("applied")})
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(slim, str(Path(tmp) / "m.onnx"))
        size_mb = (Path(tmp) / "m.onnx").stat().st_size / 2**20
    mark("onnx.save")
    return {"model": model_name, "native": [h, w], "graph_mb": round(size_mb, 1), "nodes": len(slim.graph.node), "steps": steps}


def export_cli(model_name: str, work: Path) -> dict:
    """The user's command under /usr/bin/time -v: wall time, peak RSS and the verification lines of its log."""
    import re
    import subprocess
    import sys

    cli = Path(sys.executable).with_name("vitdeploy")
    out = work / model_name
    cmd = ["/usr/bin/time", "-v", str(cli), "export", f"timm:{model_name}", "-o", str(out), "--dynamic-resolution", "--random-init"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    seconds = None
    if wall:
        parts = [float(p) for p in wall.group(1).split(":")]
        seconds = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    lines = [line for line in text.splitlines() if line.startswith(("exported", "verification", "check ", "simplified", "kept"))]
    return {"command": " ".join(cmd[2:]), "exit": proc.returncode, "wall_s": seconds,
            "peak_rss_mb": round(int(rss.group(1)) / 1024) if rss else None, "log": lines, "loadavg_after": os.getloadavg()}


def timed(cmd: list[str], min_free_gb: float) -> dict:
    """``cmd`` under /usr/bin/time -v: exit code, wall seconds, peak RSS, the log's last lines, load."""
    import re
    import subprocess

    from vitdeploy.costs import available_memory_bytes

    free_gb = (available_memory_bytes() or 0) / 1e9
    row = {"command": " ".join(cmd), "available_gb_before": round(free_gb, 1), "loadavg_before": os.getloadavg()}
    if free_gb < min_free_gb:
        return {**row, "skipped": f"only {free_gb:.1f} GB available (< {min_free_gb:g})"}
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    parts = [float(p) for p in wall.group(1).split(":")] if wall else []
    log = [line for line in text.splitlines() if line and not line.startswith("\t")]
    return {**row, "exit": proc.returncode, "wall_s": round(sum(p * 60 ** i for i, p in enumerate(reversed(parts))), 1) if parts else None,
            "peak_rss_gb": round(int(rss.group(1)) * 1024 / 1e9, 2) if rss else None, "log": log[-8:], "loadavg_after": os.getloadavg()}


def large_model(model_name: str, work: Path, min_free_gb: float) -> dict:
    """Part 4: export (dynamic), fp16 and int8 of timm:``model_name``, with sizes and verification."""
    import subprocess
    import sys

    cli = str(Path(sys.executable).with_name("vitdeploy"))
    out = work / model_name
    help_text = subprocess.run([cli, "export", "--help"], capture_output=True, text=True).stdout
    random_init = ["--random-init"] if "--random-init" in help_text else []  # pretrained weights became the default
    steps = {"export": timed([cli, "export", f"timm:{model_name}", "-o", str(out), "--dynamic-resolution", *random_init], min_free_gb)}
    if steps["export"].get("exit") == 0:
        steps["fp16"] = timed([cli, "convert", str(out), "--precision", "fp16"], min_free_gb)
        steps["int8"] = timed([cli, "calibrate", str(out), "--data", "digits:train", "--samples", "16", "--method", "minmax"], min_free_gb)
    result = {"model": model_name, "steps": steps}
    manifest_path = out / "manifest.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        result["files"] = {k: {"graph_bytes": r.get("bytes"), "data_bytes": (r.get("data") or {}).get("bytes")}
                           for k, r in manifest.get("artifacts", {}).items()}
        check = (manifest.get("records") or {}).get("export_check") or {}
        worst: dict[str, float] = {}
        for size in check.get("sizes", []):
            for name, o in size.get("outputs", {}).items():
                worst[name] = max(worst.get(name, 0.0), o.get("max_abs", 0.0))
        result["verification"] = {"passed": check.get("passed"), "max_abs": worst,
                                  "sizes": [f"{s['height']}x{s['width']}" for s in check.get("sizes", [])]}
        fp16 = manifest.get("artifacts", {}).get("fp16", {}).get("sanity")
        if fp16:
            result["fp16_sanity"] = {k: fp16.get(k) for k in ("output", "max_abs_logit_diff", "images")}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--scale", action="append", default=[], metavar="TIMM_NAME",
                        help="only part 3: time the dynamic-resolution export of this timm model (repeatable)")
    parser.add_argument("--large", action="append", default=[], metavar="TIMM_NAME",
                        help="only part 4: export, fp16 and int8 of this timm model, each under /usr/bin/time -v (repeatable)")
    parser.add_argument("--min-free-gb", type=float, default=14.0, help="part 4: skip a step when less memory is available")
    parser.add_argument("--work", type=Path, help="part 4: keep the bundles here (default: a temporary folder)")
    args = parser.parse_args()
    if args.large:
        with tempfile.TemporaryDirectory() as tmp:
            work = args.work or Path(tmp)
            result = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
                      "models": [large_model(name, work, args.min_free_gb) for name in args.large]}
        print(json.dumps(result, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return
    if args.scale:
        with tempfile.TemporaryDirectory() as tmp:
            result = {"machine": {"cpu": platform.processor() or platform.machine(), "loadavg_before": os.getloadavg()},
                      "models": [{"cli": export_cli(name, Path(tmp)), "in_process": export_steps(name)} for name in args.scale]}
        print(json.dumps(result, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result = {
            "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads, "torch": torch.__version__,
                        "onnxruntime": ort.__version__},
            "exporters": compare_exporters(args.model, args.threads, args.rounds, args.iters, work),
            "ort_vs_torch": ort_vs_torch(args.model, args.threads, args.rounds, args.iters, work),
        }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
