"""How long a model that cannot be had takes to be refused, without HF_HUB_OFFLINE (issue 26).

Each measurement is a fresh process (huggingface_hub reads HF_ENDPOINT and its timeouts at import)
with an empty HF_HOME, asking for timm's ``vit_small_patch16_224.augreg_in21k_ft_in1k``:

- ``timm``: ``timm.create_model(name, pretrained=True)`` alone, what a script calling timm gets;
- ``vitdeploy``: ``load_source("timm:<name>")``, the export's loader (one hub probe, then the cache only).

against two hubs that cannot answer: a host name that does not resolve (``http://hub.invalid``:
the DNS fails at once) and a local socket that accepts connections and never replies (each
request waits for its timeout; ``HF_HUB_ETAG_TIMEOUT=2``). The time is the call's own, measured
inside the process after the imports.

    .venv/bin/python bench/bench_hub_refusal.py --runs 3              # ~6 min: timm's retries dominate
    .venv/bin/python bench/bench_hub_refusal.py --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

MODEL = "vit_small_patch16_224.augreg_in21k_ft_in1k"
CHILD = r"""
import json, sys, time
which, model = sys.argv[1], sys.argv[2]
if which == "timm":
    import timm
    start = time.monotonic()
    try:
        timm.create_model(model, pretrained=True)
        outcome = "loaded"
    except Exception as exc:
        outcome = type(exc).__name__
else:
    from vitdeploy.exporters.sources import load_source
    from vitdeploy.errors import UserError
    import timm  # noqa: F401 - imported before the clock, as for the timm case
    start = time.monotonic()
    try:
        load_source("timm:" + model)
        outcome = "loaded"
    except UserError as exc:
        outcome = "UserError (one line)" if "\n" not in str(exc) else "UserError (several lines)"
print(json.dumps({"seconds": time.monotonic() - start, "outcome": outcome}))
"""


def measure(which: str, endpoint: str, home: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=home, HF_ENDPOINT=endpoint, HF_HUB_ETAG_TIMEOUT="2", HF_HUB_DOWNLOAD_TIMEOUT="2", HF_HUB_DISABLE_TELEMETRY="1")
    done = subprocess.run([sys.executable, "-c", CHILD, which, MODEL], capture_output=True, text=True, env=env, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{which} at {endpoint}: no result (exit {done.returncode}): {done.stderr[-400:]}")
    result = json.loads(lines[-1])
    result["stderr_lines"] = len([line for line in done.stderr.splitlines() if line.strip()])
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    rows = []
    load_start = os.getloadavg()
    with socket.socket() as silent, tempfile.TemporaryDirectory() as home:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        hubs = {"DNS failure (http://hub.invalid)": "http://hub.invalid",
                "silent socket (connects, never answers)": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        for hub_name, endpoint in hubs.items():
            for which in ("timm", "vitdeploy"):
                runs = [measure(which, endpoint, home) for _ in range(args.runs)]
                seconds = [r["seconds"] for r in runs]
                rows.append({"hub": hub_name, "loader": which, "min_s": min(seconds), "max_s": max(seconds),
                             "outcome": runs[0]["outcome"], "stderr_lines": runs[0]["stderr_lines"], "runs": len(runs)})
                print(f"{hub_name:42s} {which:9s} {min(seconds):6.1f}-{max(seconds):6.1f} s  {runs[0]['outcome']}, "
                      f"{runs[0]['stderr_lines']} stderr lines", flush=True)
    report = {"model": MODEL, "rows": rows, "load_average_start": load_start, "load_average_end": os.getloadavg()}
    print(f"load average: {load_start[0]:.2f} at start, {report['load_average_end'][0]:.2f} at end")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
