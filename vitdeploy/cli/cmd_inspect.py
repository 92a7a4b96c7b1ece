"""`vitdeploy inspect`."""

from __future__ import annotations

import click

from .common import command, echo_json, warn_random_weights
from .options import json_option


@command("inspect")
@click.argument("target", type=click.Path(exists=True))
@json_option("the full report")
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
