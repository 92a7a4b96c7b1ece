"""Load test of `vitdeploy serve` (a real Triton server, localhost only) against in-process calls.

For dynamic batching on and off, one server each (`vitdeploy serve` on free 127.0.0.1 ports), the
digits bundle is sent single-image requests by 1, 4 and 16 concurrent HTTP clients (one
tritonclient connection per client thread, closed loop: each client sends its next request when
the last one is answered). Each level is bounded by a request count and a time limit, whichever
comes first. Reported: throughput (requests/s), p50/p99 latency, failed requests. The yardstick is
`predict`-style in-process calls at the same concurrency: threads calling ``Classifier.classify``
on one image each, on the same ONNX Runtime settings (intra-op threads) as the server.

Client, server and yardstick share the machine's cores: on a 2-core machine the Python client
threads compete with tritonserver and the model for CPU, so the absolute numbers are a floor; the
ratios within one run (c16 vs c1, batching on vs off) are what this measures.

    .venv/bin/python bench/bench_serve.py                      # ~2 min: exports digits if no --bundle
    .venv/bin/python bench/bench_serve.py --bundle demo-bundle --requests 600 --max-seconds 20 --json serve.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ensure_bundle(path: str | None) -> Path:
    if path:
        return Path(path)
    target = Path(tempfile.gettempdir()) / "vitdeploy-bench-serve" / "digits"
    if not (target / "manifest.json").is_file():
        from vitdeploy.exporters import ExportOptions, export

        log(f"exporting builtin:digits to {target} ...")
        export("builtin:digits", target, ExportOptions(check_images=4))
    return target


def closed_loop(concurrency: int, requests: int, max_seconds: float, make_call: Callable[[], Callable[[int], Any]]) -> dict[str, Any]:
    """``concurrency`` workers share a budget of ``requests`` calls and a deadline; latencies in ms."""
    latencies: list[float] = []
    failures: list[str] = []
    counter = iter(range(requests))
    lock = threading.Lock()
    ready = threading.Barrier(concurrency + 1)
    stop_at = [0.0]

    def worker() -> None:
        call = make_call()  # per-thread client/session handle, built before the clock starts
        ready.wait()
        while time.perf_counter() < stop_at[0]:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            t0 = time.perf_counter()
            try:
                call(i)
            except Exception as exc:  # noqa: BLE001 - a failed request is a result here
                with lock:
                    failures.append(repr(exc)[:200])
                continue
            with lock:
                latencies.append((time.perf_counter() - t0) * 1e3)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + max_seconds + 3600  # set properly once every worker is ready
    ready.wait()
    start = time.perf_counter()
    stop_at[0] = start + max_seconds
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return _summary(concurrency, latencies, failures, wall)


def _summary(concurrency: int, latencies: list[float], failures: list[str], wall: float) -> dict[str, Any]:
    lat = np.array(latencies) if latencies else np.array([float("nan")])
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "failed": len(failures),
        "failures": failures[:5],
        "seconds": round(wall, 3),
        "throughput_rps": round(len(latencies) / wall, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
    }


def grpc_closed_loop(server: Any, images: np.ndarray, concurrency: int, requests: int, max_seconds: float) -> dict[str, Any]:
    """``concurrency`` requests kept outstanding with gRPC ``async_infer``: each answer frees a slot for the next.

    Python threads with a blocking client each (the HTTP variant, ``--protocol http``) spend the
    GIL on the client side at high concurrency; gRPC's async calls leave the waiting to its C core,
    so the load generator is not what saturates first."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    slots = threading.Semaphore(concurrency)  # one slot per outstanding request

    def finished(t0: float, result: Any, error: Any) -> None:
        # gRPC may run this at once in the sending thread (the call completed before the callback
        # was attached): it takes no lock the sender holds.
        ms = (time.perf_counter() - t0) * 1e3
        with lock:
            if error is not None:
                failures.append(str(error)[:200])
            elif result.as_numpy("probs").shape != (1, 10):
                failures.append(f"probs shape {result.as_numpy('probs').shape}")
            else:
                latencies.append(ms)
        slots.release()

    start = time.perf_counter()
    deadline = start + max_seconds
    for i in range(requests):
        if not slots.acquire(timeout=max(0.0, deadline - time.perf_counter())):
            break
        img = images[i % len(images)][None]
        inp = grpcclient.InferInput("images", list(img.shape), "UINT8")
        inp.set_data_from_numpy(img)
        t0 = time.perf_counter()
        client.async_infer(server.model_name, [inp], callback=functools.partial(finished, t0))
    for _ in range(concurrency):  # the outstanding ones
        if not slots.acquire(timeout=120):
            failures.append("no answer within 120 s")
            break
    wall = time.perf_counter() - start
    client.close()
    return _summary(concurrency, latencies, failures, wall)


def http_closed_loop(server: Any, images: np.ndarray, concurrency: int, requests: int, max_seconds: float) -> dict[str, Any]:
    import tritonclient.http as httpclient

    def make_call() -> Callable[[int], Any]:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)

        def call(i: int) -> None:
            img = images[i % len(images)][None]
            inp = httpclient.InferInput("images", list(img.shape), "UINT8")
            inp.set_data_from_numpy(img)
            probs = client.infer(server.model_name, [inp]).as_numpy("probs")
            if probs.shape != (1, 10):
                raise RuntimeError(f"probs shape {probs.shape}")

        return call

    return closed_loop(concurrency, requests, max_seconds, make_call)


def bench_server(bundle: Path, images: np.ndarray, batching: bool, args: argparse.Namespace) -> list[dict[str, Any]]:
    from vitdeploy.serve.process import ServeProcess

    extra = ["--max-batch", str(args.max_batch), "--max-queue-delay-us", str(args.max_queue_delay_us), "--threads", str(args.threads)]
    extra.append("--dynamic-batching" if batching else "--no-dynamic-batching")
    load = grpc_closed_loop if args.protocol == "grpc" else http_closed_loop
    rows = []
    with ServeProcess(bundle, extra, log_path=Path(tempfile.gettempdir()) / f"vitdeploy-bench-serve-{os.getpid()}.log") as server:
        log(f"server up (dynamic batching {'on' if batching else 'off'}): {server.http_url}")
        load(server, images, 4, 100, 10)  # warm-up: connections, the batcher, ORT's first runs
        for c in args.concurrency:
            row = load(server, images, c, args.requests, args.max_seconds)
            row.update(mode=f"triton {args.protocol}, dynamic batching {'on' if batching else 'off'}")
            log(json.dumps(row))
            rows.append(row)
    return rows


def bench_in_process(bundle: Path, images: np.ndarray, args: argparse.Namespace) -> list[dict[str, Any]]:
    from vitdeploy.runtime.classifier import Classifier

    clf = Classifier.load(bundle, prefer=("onnxruntime",), threads=args.threads)

    def make_call() -> Callable[[int], Any]:
        return lambda i: clf.classify(images[i % len(images)], top_k=1)

    closed_loop(2, 100, 10, make_call)
    rows = []
    for c in args.concurrency:
        row = closed_loop(c, args.requests, args.max_seconds, make_call)
        row.update(mode="in-process Classifier.classify")
        log(json.dumps(row))
        rows.append(row)
    clf.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", help="bundle to serve (default: builtin digits, exported to a temp folder once)")
    parser.add_argument("--concurrency", type=lambda s: [int(v) for v in s.split(",")], default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=600, help="request budget per level")
    parser.add_argument("--max-seconds", type=float, default=15.0, help="time limit per level")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-queue-delay-us", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (server instance and yardstick)")
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="grpc: async requests from one thread; http: one blocking client per thread")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()

    from vitdeploy.bundle import Bundle

    bundle = ensure_bundle(args.bundle)
    b = Bundle.open(bundle)
    from vitdeploy.images import model_input_size

    h, w = model_input_size(b.preprocessing, b.resolution, b.spec.patch_size, None)
    rng = np.random.default_rng(0)
    if b.name == "digits":
        from vitdeploy.builtin import BUILTIN_MODELS

        images = BUILTIN_MODELS["digits"].load_split("test")[0]
    else:
        images = rng.integers(0, 256, (64, h, w, 3), dtype=np.uint8)
    load_before = os.getloadavg()
    rows = bench_in_process(bundle, images, args)
    rows += bench_server(bundle, images, True, args)
    rows += bench_server(bundle, images, False, args)
    load_after = os.getloadavg()

    print("| mode | concurrency | requests | failed | throughput (req/s) | p50 (ms) | p99 (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['concurrency']} | {r['requests']} | {r['failed']} | {r['throughput_rps']} | {r['p50_ms']} | {r['p99_ms']} |")
    print(f"\nserver: {args.protocol}, --max-batch {args.max_batch} --max-queue-delay-us {args.max_queue_delay_us} --threads {args.threads}; {args.requests} requests or {args.max_seconds:.0f} s per level")
    on = {r["concurrency"]: r for r in rows if r["mode"].endswith("batching on")}
    off = {r["concurrency"]: r for r in rows if r["mode"].endswith("batching off")}
    lo, hi = min(args.concurrency), max(args.concurrency)
    if lo in on and hi in on:
        print(f"\ndynamic batching on: c{hi}/c{lo} throughput = {on[hi]['throughput_rps'] / on[lo]['throughput_rps']:.2f}x")
    if hi in on and hi in off:
        print(f"c{hi}: batching on/off throughput = {on[hi]['throughput_rps'] / off[hi]['throughput_rps']:.2f}x")
    print(f"failed requests, all server levels: {sum(r['failed'] for r in rows if r['mode'].startswith('triton'))}")
    print(f"load average (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}; {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "load_before": load_before, "load_after": load_after}, indent=2))


if __name__ == "__main__":
    main()
