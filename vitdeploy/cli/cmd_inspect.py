"""`vitdeploy inspect`."""

from __future__ import annotations

import click

from .common import command, echo_json, warn_random_weights


@command("inspect")
@click.argument("target", type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
def command(target, as_json):
    """Show what a bundle or vitdeploy .onnx carries: source, weights hash, spec, preprocessing, labels, cost.

    \b
    Example:
      vitdeploy inspect digits-bundle
      vitdeploy inspect digits-bundle/model.onnx --json
    """
    warn_random_weights(target)
    from ..describe import inspect_report, print_inspect

    report = inspect_report(target)
    if as_json:
        echo_json(report)
    else:
        print_inspect(report)
