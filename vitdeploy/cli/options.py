"""Click options shared by several commands, declared once (as sqlite-utils' ``cli.py`` does).

``--precision``: its choices come from the precision registry (``vitdeploy.precisions``), so a new
precision reaches every command that takes one without editing the commands.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import click

from .. import precisions

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def precision_option(help: str, names: Optional[Sequence[str]] = None, best: bool = True, best_first: bool = True,
                     default: Optional[str] = precisions.BEST, required: bool = False) -> Decorator:
    """``--precision`` with one choice: ``names`` (default: every precision) and ``best`` (first or last);
    ``default`` shown unless it is None."""
    choices = list(names) if names is not None else list(precisions.NAMES)
    if best:
        choices = [precisions.BEST] + choices if best_first else choices + [precisions.BEST]
    extra: dict[str, Any] = {"required": True} if required else {"default": default, "show_default": default is not None}
    return click.option("--precision", type=click.Choice(choices), help=help, **extra)


def precision_list_option(help: str, param: str = "precision") -> Decorator:
    """``--precision`` taking several, comma-separated (default: every graph in the bundle); the command
    checks each name against the bundle."""
    return click.option("--precision", param, default=None, help=help)


def reduced_names(order: str = "registry") -> tuple[str, ...]:
    """The reduced precisions (gated against fp32): in registry order, or ``best`` first."""
    if order == "best":
        return precisions.REDUCED
    return tuple(n for n in precisions.NAMES if n in precisions.REDUCED)


def best_rule() -> str:
    """'int8, else fp16, else fp32': what ``best`` takes, as the help says it."""
    return ", else ".join(precisions.BEST_ORDER)


def graph_files() -> str:
    """'model.onnx, model.fp16.onnx, model.int8.onnx'."""
    return ", ".join(precisions.get(n).artifact for n in precisions.NAMES)
