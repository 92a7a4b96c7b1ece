"""What every command shares: error mapping and small option parsers.

A VitDeployError becomes one line on stderr and its exit code (1 for user errors); Click's usage
errors keep exit code 2. Commands work the same when invoked alone (tests call them directly).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ..errors import VitDeployError


class VitCommand(click.Command):
    """A Click command that maps VitDeployError to one clean line and a non-zero exit."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except VitDeployError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except ImportError as exc:
            # An optional dependency missing below a lazy import: one line with what to install.
            from ..lazy import install_hint

            module = getattr(exc, "name", None) or str(exc)
            click.echo(f"error: {module} is needed for `{ctx.command.name}` but cannot be imported ({exc}); {install_hint(module)}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted: nothing was written (artifacts are replaced atomically)", err=True)
            ctx.exit(130)


def command(name: str, **kwargs: Any):
    """``@command("export")`` - a VitCommand with vitdeploy's help settings."""
    kwargs.setdefault("context_settings", {"help_option_names": ["-h", "--help"], "max_content_width": 100})
    return click.command(name, cls=VitCommand, **kwargs)


def split_csv(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def parse_int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in split_csv(text)]
    except ValueError:
        raise click.BadParameter(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise click.BadParameter(f"{what} must be positive integers, got {text!r}")
    return values


def echo_json(obj: Any) -> None:
    import json

    from ..fileio import _json_default

    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


def parse_model_args(items: tuple[str, ...]) -> dict[str, Any]:
    """KEY=VALUE pairs; values read as JSON when they parse (true, 6, 0.1, [1,2]), else as text."""
    import json

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--model-arg")
        text = raw.strip()
        lowered = text.lower()
        if lowered in ("true", "false", "none", "null"):
            out[key.strip()] = {"true": True, "false": False}.get(lowered)
            continue
        try:
            out[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            out[key.strip()] = text
    return out


def warn_random_weights(target: Any) -> None:
    """The one-line notice (vitdeploy.weights) on stderr when the bundle at ``target`` holds random weights.

    Every command that uses a bundle calls it first; an unreadable target is left to the command's
    own error.
    """
    from ..bundle import Bundle
    from ..weights import random_weights_notice

    try:
        manifest = Bundle.open(target).manifest
    except (VitDeployError, OSError, ValueError):
        return
    notice = random_weights_notice(manifest.get("source"))
    if notice:
        click.echo(f"warning: {notice}", err=True)
