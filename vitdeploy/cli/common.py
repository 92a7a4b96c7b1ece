"""What every command shares: error mapping and small option parsers.

Every error is one line on stderr (`error: ...`) and a non-zero exit: 2 for usage (Click's own usage
errors and vitdeploy's UsageError: options that exclude each other, values outside the choices), 1 for
everything else (a VitDeployError's exit_code), 130 for Ctrl-C and 143 for SIGTERM. Commands work the
same when invoked alone (tests call them directly).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any

import click

from ..errors import Terminated, VitDeployError


# True for every command: a file and the manifest record that vouches for it land in one signal-free step
# (fileio.signals_deferred), so an interruption finds each either as it was or whole and recorded.
_WHAT_IS_LEFT = "stopped; no file is half-written (each lands whole, with its manifest record, or not at all)"


def _raise_interrupt(signum: int, frame: Any) -> None:
    from ..fileio import note_interrupt

    note_interrupt(signum)  # remembered, in case the exception lands where Python swallows it
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _swallowed_interrupts_are_silent(unraisable: Any, previous: Any = sys.unraisablehook) -> None:
    """An interrupt raised inside a weakref callback or __del__ is dropped by Python with an "Exception
    ignored" traceback; it is raised again at the next commit point (fileio.raise_if_interrupted)."""
    if not (isinstance(unraisable.exc_type, type) and issubclass(unraisable.exc_type, KeyboardInterrupt)):
        previous(unraisable)


@contextlib.contextmanager
def _signals_unwind() -> Any:
    """Turn SIGINT and SIGTERM into KeyboardInterrupt / Terminated while a command runs, unless someone
    installed a handler already (`serve` sets its own, to drain requests; a background launcher ignores
    SIGINT) or this is not the main thread (signals go there only)."""
    from ..fileio import forget_interrupt

    forget_interrupt()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig, stock in ((signal.SIGTERM, (signal.SIG_DFL, None)), (signal.SIGINT, (signal.default_int_handler,))):
        if signal.getsignal(sig) in stock:
            previous[sig] = signal.signal(sig, _raise_interrupt)
    hook, sys.unraisablehook = sys.unraisablehook, _swallowed_interrupts_are_silent
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


class OneLineErrors:
    """Click's own errors (unknown option, missing argument, bad value) as one line like ours, with the
    command's help named, instead of Click's usage block; exit code 2 for usage, as Click has it."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)  # type: ignore[misc]
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)  # type: ignore[misc]
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "vitdeploy"
            click.echo(f"error: {one_line(exc.format_message()).rstrip('.')}; see `{where} --help`", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"error: {one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(1)
        # outside standalone mode Click returns ctx.exit()'s code instead of exiting with it
        sys.exit(result if isinstance(result, int) and not isinstance(result, bool) else 0)


class VitGroup(OneLineErrors, click.Group):
    """The `vitdeploy` group: one-line usage errors for unknown commands too."""


class VitCommand(OneLineErrors, click.Command):
    """A Click command that maps VitDeployError to one clean line and a non-zero exit."""

    def invoke(self, ctx: click.Context) -> Any:
        from ..fileio import interrupted
        from .options import apply_verbosity

        apply_verbosity(ctx)  # the log's level for this command: the group's -v/-q, --json
        try:
            with _signals_unwind():
                result = super().invoke(ctx)
            if interrupted() is not None:  # swallowed (see fileio.raise_if_interrupted) and the command still finished
                self._report_interrupt(ctx)
            return result
        except VitDeployError as exc:
            if interrupted() is None:
                click.echo(f"error: {one_line(exc)}", err=True)
                ctx.exit(exc.exit_code)
            self._report_interrupt(ctx)
        except ImportError as exc:
            if interrupted() is not None:  # a C extension's init cut short by the signal says "initialization failed"
                self._report_interrupt(ctx)
            # An optional dependency missing below a lazy import: one line with what to install.
            from ..lazy import install_hint

            module = getattr(exc, "name", None) or str(exc)
            click.echo(f"error: {module} is needed for `{ctx.command.name}` but cannot be imported ({exc}); {install_hint(module)}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt as exc:
            self._report_interrupt(ctx, signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
        except Exception as exc:
            # a write the file system refused inside a library no helper wrapped (fileio/onnx_io convert
            # their own): the same one line (vitdeploy.storage), not a traceback
            from ..storage import storage_cause

            refused = None if isinstance(exc, (click.exceptions.Exit, click.ClickException)) else storage_cause(exc)
            if refused is None:
                raise
            if interrupted() is not None:
                self._report_interrupt(ctx)
            click.echo(f"error: {one_line(refused)}", err=True)
            ctx.exit(refused.exit_code)

    @staticmethod
    def _report_interrupt(ctx: click.Context, signum: int = signal.SIGINT) -> None:
        from ..fileio import forget_interrupt, interrupted

        signum = interrupted() or signum
        forget_interrupt()
        _release_unwound_frames()
        if signum == signal.SIGTERM:
            click.echo(f"terminated (SIGTERM): {_WHAT_IS_LEFT}", err=True)
            ctx.exit(143)
        click.echo(f"interrupted: {_WHAT_IS_LEFT}", err=True)
        ctx.exit(130)


def _release_unwound_frames() -> None:
    """Free what the interrupted work still holds before the interpreter exits.

    The exception being handled keeps every frame it unwound alive, and with them an ONNX Runtime
    session cut short mid-pass. Left to interpreter shutdown, its thread pool is destroyed while
    modules are torn down, which aborts the process ("terminate called without an active
    exception", exit 134) after the one-line report. Clearing those frames and collecting now
    destroys the session while the runtime is intact, so the exit code stays 130/143."""
    import gc
    import traceback

    exc = sys.exc_info()[1]
    if exc is not None and exc.__traceback__ is not None:
        traceback.clear_frames(exc.__traceback__)  # frames still executing (this one) are skipped
    gc.collect()


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

    from ..fileio import json_default

    sys.stdout.write(json.dumps(obj, indent=2, default=json_default) + "\n")


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


def graph_memory_line(record: dict[str, Any]) -> str:
    """``model.fp16.onnx 1.2 GiB [+ model.fp16.onnx.data ...]; peak resident memory ...``: a written
    graph's files (vitdeploy.onnx_io) and this process's high-water mark (getrusage, issue 32)."""
    import resource
    import sys

    def size(n: float) -> str:
        for power, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
            if n >= 2**power:
                return f"{n / 2**power:.1f} {unit}"
        return f"{n:.0f} B"

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    data = record.get("data")
    files = f"{record.get('file')} {size(record.get('bytes') or 0)}" + (f" + {data['file']} {size(data['bytes'])}" if data else "")
    return f"{files}; peak resident memory of this process {size(peak)} (getrusage)"


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
