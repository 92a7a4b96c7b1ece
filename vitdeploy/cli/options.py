"""Click options that several commands share, declared once (as sqlite-utils' cli.py does).

``gate_options``: the thresholds of the accuracy gate (vitdeploy.gate.Gate), under one set of names in
every command, with the defaults read from Gate; the spellings used before issue 37 stay accepted as
hidden aliases (``--cosine-min``, ``--top1-min``, ``--min-agreement``, ``--max-drop``), so scripts keep
working and ``--help`` names only the current ones. ``json_option``: ``--json``. ``verbosity_options``:
the group's ``-v/--verbose`` and ``-q/--quiet``, applied to the log by :func:`apply_verbosity`.
``precision_option`` / ``precision_list_option``: ``--precision``, its choices from the precision registry
(``vitdeploy.precisions``), so a new precision reaches every command that takes one without editing them.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import click

from .. import precisions
from ..gate import Gate

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]

_DEFAULT = Gate()


class AliasedOption(click.Option):
    """An option whose older spellings are accepted but not shown in ``--help``."""

    def __init__(self, *args: Any, hidden_aliases: tuple[str, ...] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.hidden_aliases = tuple(hidden_aliases)

    def get_help_record(self, ctx: click.Context) -> Any:
        shown, self.opts = self.opts, [o for o in self.opts if o not in self.hidden_aliases]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown


# (current name, hidden aliases, Gate field, click type, help); fp32 parity only where fp32 graphs are judged (check)
_TASK_OPTIONS = (
    ("--min-cosine", ("--cosine-min",), "min_cosine", click.FloatRange(-1.0, 1.0),
     "Gate (fp16/int8): smallest 1st percentile of the per-image cosine with fp32, on every scored output."),
    ("--min-top1-agreement", ("--top1-min", "--min-agreement"), "min_agreement", click.FloatRange(0.0, 1.0),
     "Gate (fp16/int8): smallest top-1 agreement with fp32 on real images (0..1)."),
    ("--max-accuracy-drop", ("--max-drop",), "max_drop_points", click.FloatRange(min=0.0),
     "Gate (fp16/int8): largest accuracy drop against fp32, in points."),
)
_PARITY_OPTIONS = (
    ("--fp32-max-abs", (), "fp32_max_abs", click.FloatRange(min=0, min_open=True), "Gate (fp32): largest |d| of every output against PyTorch."),
)
GATE_PARAM = "gate"  # the keyword the command receives its Gate under


def gate_options(parity: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the gate's options to a command; it receives one ``gate`` keyword (a Gate) instead of them.
    ``parity``: also the fp32 thresholds (commands that judge fp32 graphs)."""
    declared = _TASK_OPTIONS + (_PARITY_OPTIONS if parity else ())
    names = {field for _, _, field, _, _ in declared}

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        import functools

        @functools.wraps(f)
        def run(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in names}
            return f(*args, **{GATE_PARAM: Gate(**values)}, **kwargs)

        for name, aliases, field, kind, help_text in reversed(declared):
            run = click.option(name, *aliases, field, cls=AliasedOption, hidden_aliases=aliases, type=kind,
                               default=getattr(_DEFAULT, field), show_default=True, help=help_text)(run)
        return run

    return decorate


def gate_option_names(parity: bool = False) -> list[str]:
    """The current names of the gate options (what every command's --help shows)."""
    return [name for name, *_ in _TASK_OPTIONS + (_PARITY_OPTIONS if parity else ())]


def json_option(what: str = "the report", help: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--json`` (parameter ``as_json``): print WHAT as JSON on stdout. Progress lines are then left out,
    as with ``vitdeploy -q`` (:func:`apply_verbosity`), unless -v asks for them."""
    return click.option("--json", "as_json", is_flag=True, help=help or f"Print {what} as JSON.")



VERBOSITY = "vitdeploy.verbosity"  # ctx.meta key: shared by the group's context and its command's


def verbosity_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``-v/--verbose`` and ``-q/--quiet`` on the command group; the group's callback receives neither
    (they land in ctx.meta for the command that runs)."""

    def remember(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value:
            ctx.meta[VERBOSITY] = 1 if param.name == "verbose" else -1

    f = click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=remember, is_eager=True,
                     help="Print results and errors only (no progress lines).")(f)
    return click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=remember, is_eager=True,
                        help="Also print debug detail: timings of steps, sizes, what was chosen and why.")(f)


def apply_verbosity(ctx: click.Context) -> None:
    """Set the log's level for the command about to run: the group's -v/-q, else quiet for --json (stdout
    is the JSON; progress lines stay off stderr as before), else progress lines."""
    from ..console import NORMAL, QUIET, configure_logging

    level = ctx.meta.get(VERBOSITY)
    if level is None:
        level = QUIET if ctx.params.get("as_json") else NORMAL
    configure_logging(level)



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
