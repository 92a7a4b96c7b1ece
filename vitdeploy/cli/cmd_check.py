"""`vitdeploy check`."""

from __future__ import annotations

import click

from .common import command, echo_json, split_csv, warn_random_weights
from .options import gate_options, json_option, precision_list_option
from ..remote.cli import on_device


@command("check")
@on_device(inputs=("data",))  # --on HOST: run on a device over ssh (vitdeploy/remote)
@click.argument("bundle", type=click.Path(exists=True))
@precision_list_option("Graphs to check, comma-separated (default: every graph in the bundle).")
@click.option("--data", default=None, help="Real labelled images: digits:test, DIR/<class>/<image>, a .npz with images + labels, or a uint8 .npy at the input size (default: the bundled model's test split).")
@click.option("--images", "random_count", type=click.IntRange(min=1), default=64, show_default=True, help="Seeded random images per size.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--batch", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use at most this many real images (a seeded random subset).")
@gate_options(parity=True)
@click.option("--localise", type=click.Choice(["on-failure", "always", "never"]), default="on-failure", show_default=True,
              help="Compare PyTorch module outputs with the graph's to name the first diverging block.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Threads for ONNX Runtime and PyTorch.")
@json_option("the report")
def command(bundle, precision, data, random_count, seed, batch, limit, gate, localise, threads, as_json):
    """Evidence that BUNDLE's graphs compute what PyTorch computes: numbers, accuracy, protocol.

    Exit code 0: every gate holds; 1: a gate failed (the report says which and where); 2: usage.
    The report is also written to BUNDLE/reports/check.json.

    \b
    Example:
      vitdeploy check digits-bundle
      vitdeploy check vits-bundle --data ./val --precision fp16,int8 --json
    """
    warn_random_weights(bundle)
    from ..checks import CheckOptions, run_check
    from ..checks.report import print_report

    options = CheckOptions(
        precisions=tuple(split_csv(precision)) or None, data=data, random_count=random_count, seed=seed, batch=batch, limit=limit,
        gate=gate, localise=localise, threads=threads,
    )
    report = run_check(bundle, options)  # progress lines: the module's logger (vitdeploy -v/-q)
    if as_json:
        echo_json(report)
    else:
        print_report(report)
    if not report["passed"]:
        raise click.exceptions.Exit(1)
