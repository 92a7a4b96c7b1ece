"""`vitdeploy profile`."""

from __future__ import annotations

import click

from ..errors import UserError
from ..spec import parse_resolution
from .common import command, echo_json, parse_int_list, split_csv


@command("profile")
@click.argument("bundle")
@click.option("--resolutions", default=None, help="Comma-separated N or HxW (default: the bundle's native size).")
@click.option("--batch", "batches", default="1", show_default=True, help="Comma-separated batch sizes.")
@click.option("--precision", "precisions", default=None, help="Comma-separated fp32, fp16, int8 (default: every graph in the bundle).")
@click.option("--backend", "backends", default="ort", show_default=True, help="Comma-separated ort, torch, tensorrt.")
@click.option("--iterations", type=int, default=None, help="Timed calls per cell (instead of --duration).")
@click.option("--duration", type=float, default=None, help="Seconds of timed calls per cell, at least 10 calls [default: 3].")
@click.option("--rounds", type=int, default=None,
              help="Load every cell, then time them interleaved over this many rounds (fair on a busy machine).")
@click.option("--warmup", type=int, default=10, show_default=True, help="Untimed calls per cell before timing.")
@click.option("--threads", type=int, default=None, help="Intra-op threads for CPU backends [default: every CPU this process may use].")
@click.option("--pin", is_flag=True, help="Also pin the process to the first --threads CPUs it may use (Linux).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where torch runs, and whether ort uses its CUDA provider.")
@click.option("--cv-threshold", type=float, default=0.10, show_default=True, help="Flag a cell unstable above this coefficient of variation.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write the reports here instead of the bundle's reports/ folder.")
@click.option("--no-plot", is_flag=True, help="Skip reports/profile.png.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report instead of the table.")
def command(bundle, resolutions, batches, precisions, backends, iterations, duration, rounds, warmup, threads, pin, device, cv_threshold,
            out_dir, no_plot, as_json):
    """Latency and throughput across resolutions, batch sizes, precisions and backends, beside the cost model.

    Each cell gets its own runner load (start-up = load to first result), a warm-up, then a fixed
    number of timed calls or a time budget: p50/p90/p99, mean, std, min, throughput, peak memory,
    the coefficient of variation (flagged when unstable), the cost model's multiply-adds, achieved
    GFLOP/s and its share of this machine's GEMM peak measured in the same run. On a Jetson,
    tegrastats is sampled during each cell and the nvpmodel / jetson_clocks state is recorded.
    Writes reports/profile.csv, profile.json and profile.png. With --rounds, every cell is loaded
    first and the timed calls are interleaved (A B C, C B A, ...), so load from other processes or
    thermal drift falls on all cells alike.

    \b
    Example:
      vitdeploy profile digits-bundle
      vitdeploy profile vits --resolutions 160,224,288,384 --batch 1,8 --precision fp32,int8 --backend ort,torch
      vitdeploy profile vits --resolutions 160,224,288,384 --batch 1,8 --iterations 20 --rounds 10
      vitdeploy profile vits --resolutions 224x320 --iterations 200 --threads 4 --pin --json
    """
    from ..console import get_console
    from ..profile import SweepConfig, profile_bundle
    from ..profile.report import render_table, to_json

    config = SweepConfig(
        resolutions=[parse_resolution(r) for r in split_csv(resolutions)] or None,
        batches=parse_int_list(batches, "--batch"),
        precisions=split_csv(precisions) or None,
        backends=split_csv(backends),
        iterations=iterations,
        duration_s=duration,
        rounds=rounds,
        warmup=warmup,
        threads=threads,
        pin=pin,
        device=device,
        cv_threshold=cv_threshold,
    )
    outcome = profile_bundle(bundle, config, out_dir=out_dir, plot=not no_plot, progress_console=get_console(stderr=True))
    result = outcome.result
    if as_json:
        echo_json(to_json(result))
    else:
        render_table(result, get_console())
        for kind, path in outcome.paths.items():
            click.echo(f"{kind}: {path}")
    failed = result.failed
    if failed:
        first = failed[0]
        raise UserError(f"{len(failed)} of {len(result.rows)} cells failed (reports written); first: "
                        f"{first['backend']} {first['precision']} {first['height']}x{first['width']} b{first['batch']}: {first['note']}")
