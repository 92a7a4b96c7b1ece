"""`vitdeploy report`."""

from __future__ import annotations

import click

from .common import command


@command("report")
@click.argument("bundle", type=click.Path())
@click.option("-o", "--output", "output", type=click.Path(), default=None,
              help="The page to write (default: BUNDLE/reports/index.html); MODEL_CARD.md is written beside it.")
def command(bundle, output):
    """One self-contained HTML page for a bundle, and a Hugging Face model card beside it.

    The page gathers what the bundle carries: identity (source, weights sha256, versions), input contract,
    cost model, check evidence per graph (stale when a graph changed since), precision, robustness
    (evaluate), latency (profile) and engines. A section with nothing to show names the command that
    would fill it. No script, font or image is fetched from the network: it opens offline.

    \b
    Example:
      vitdeploy report digits-bundle
      vitdeploy report digits-bundle -o /media/usb/digits.html
    """
    from ..report import write_report

    outcome = write_report(bundle, output)
    if outcome.random_weights:
        click.echo("warning: the bundle's weights are RANDOM; the page says so in a red banner", err=True)
    for line in outcome.unreadable:
        click.echo(f"warning: unreadable record left out: {line}", err=True)
    click.echo(f"model card: {outcome.card}")
    click.echo(f"report: {outcome.page}")
