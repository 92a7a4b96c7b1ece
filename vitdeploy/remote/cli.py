"""Click glue for ``--on``: the shared options, the argv rebuilt for the device, and the agent command.

A command opts in with one line under its ``@command(...)``::

    @on_device(inputs=("images",))          # path parameters copied to the device
    @on_device(outputs=("out_dir",))        # path parameters brought back after the run
    @on_device(inputs=("timing_cache",), outputs=("timing_cache",))   # both (read and updated)

Without ``--on`` the command runs here exactly as before. With it, the command line the user typed
(the parameters they set; defaults are left to the device's vitdeploy, which is the same version or
refused) is rebuilt for the device, its path arguments rewritten to where they were copied.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, List, Sequence, Tuple

import click

from ..errors import UserError

ON_PARAMS = ("on", "remote_vitdeploy", "remote_dir")


def _remote_options() -> List[Callable[[Any], Any]]:
    return [
        click.option("--on", "on", metavar="[USER@]HOST[:PORT]", default=None,
                     help="Run this command on that device over ssh (your own keys and ~/.ssh/config): the bundle is copied "
                          "(only files that changed), engines/ and reports/ come back. Extra ssh options: VITDEPLOY_SSH_OPTIONS."),
        click.option("--remote-vitdeploy", metavar="PATH", default="vitdeploy", show_default=True,
                     help="With --on: the device's vitdeploy, e.g. ~/vitdeploy-venv/bin/vitdeploy."),
        click.option("--remote-dir", metavar="DIR", default=None,
                     help="With --on: where the bundle is kept on the device [default: ~/.cache/vitdeploy/remote/<bundle>-<id>]."),
    ]


def on_device(bundle: str = "bundle", inputs: Sequence[str] = (), outputs: Sequence[str] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add ``--on``/``--remote-vitdeploy``/``--remote-dir`` to a command (place it right under ``@command``)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, on: Any = None, remote_vitdeploy: str = "vitdeploy", remote_dir: Any = None, **kwargs: Any) -> Any:
            if not on:
                if remote_dir is not None or remote_vitdeploy != "vitdeploy":
                    raise UserError("--remote-vitdeploy and --remote-dir only mean something with --on HOST")
                return func(*args, **kwargs)
            return _run_on_device(click.get_current_context(), on, remote_vitdeploy, remote_dir, bundle, inputs, outputs)

        # Our options go first in the list Click reverses, so they are listed last in --help.
        params = list(getattr(func, "__click_params__", []))
        wrapper.__click_params__ = []  # type: ignore[attr-defined]
        for option in reversed(_remote_options()):
            option(wrapper)
        wrapper.__click_params__ = wrapper.__click_params__ + params  # type: ignore[attr-defined]
        return wrapper

    return decorate


def _option_words(param: click.Option, value: Any) -> List[str]:
    name = max((o for o in param.opts if o.startswith("--")), key=len, default=param.opts[0])
    if param.is_flag:
        if param.secondary_opts and not value:
            return [param.secondary_opts[0]]
        return [name] if value else []
    if getattr(param, "count", False):
        return [name] * int(value or 0)
    values = value if param.multiple else [value]
    words: List[str] = []
    for item in values:
        if item is None:
            continue
        parts = item if isinstance(item, (tuple, list)) else (item,)
        words += [name, *(str(p) for p in parts)]
    return words


def build_request(ctx: click.Context, on: str, remote_vitdeploy: str, remote_dir: Any, bundle_param: str,
                  inputs: Iterable[str], outputs: Iterable[str]) -> Any:
    """The device's command line from what the user set, with path arguments mapped under ROOT/work."""
    from .session import PathArg, RemoteRequest, work_relpath

    inputs, outputs = set(inputs), set(outputs)
    paths: List[PathArg] = []

    def mapped(name: str, value: Any) -> Any:
        if name not in inputs and name not in outputs or value is None:
            return value
        text = str(value)
        local = Path(text)
        if name in inputs and not local.exists() and name not in outputs:
            if ":" in text.split("/", 1)[0]:  # a data spec like digits:test, not a path: passed as given
                return value
            raise UserError(f"{text}: no such file or folder here (with --on, inputs are copied from this machine to the device)")
        rel = work_relpath(text)
        paths.append(PathArg(local=local, rel=rel, upload=name in inputs, download=name in outputs))
        return rel

    options: List[str] = []
    positionals: List[str] = []
    bundle_value = None
    for param in ctx.command.params:
        if param.name in ON_PARAMS or param.name is None:
            continue
        value = ctx.params.get(param.name)
        if param.name == bundle_param:
            bundle_value = value
            continue
        if isinstance(param, click.Argument):
            items = value if param.nargs != 1 else [value]
            positionals += [str(mapped(param.name, v)) for v in items if v is not None]
            continue
        source = ctx.get_parameter_source(param.name)
        if source is not None and source.name in ("DEFAULT", "DEFAULT_MAP"):
            continue  # left to the device's vitdeploy (the same version, or refused)
        if isinstance(param, click.Option):
            if param.multiple:
                value = tuple(mapped(param.name, v) for v in value)
            else:
                value = mapped(param.name, value)
            options += _option_words(param, value)
    if bundle_value is None:
        raise UserError("--on needs the bundle argument")
    return RemoteRequest(on=on, command=ctx.command.name or "", bundle=str(bundle_value), options=options,
                         positionals=positionals, paths=paths, remote_vitdeploy=remote_vitdeploy, remote_dir=remote_dir)


def _run_on_device(ctx: click.Context, on: str, remote_vitdeploy: str, remote_dir: Any, bundle_param: str,
                   inputs: Iterable[str], outputs: Iterable[str]) -> None:
    from . import session

    request = build_request(ctx, on, remote_vitdeploy, remote_dir, bundle_param, inputs, outputs)
    outcome = session.run(
        request,
        log=lambda line: click.echo(line, err=True),
        out=lambda text: click.echo(text, nl=False),
        err=lambda text: click.echo(text, nl=False, err=True),
    )
    if outcome.returncode != 0:
        raise click.exceptions.Exit(outcome.returncode)


# -- the device side ---------------------------------------------------------------------------
@click.group("remote-agent", hidden=True, context_settings={"help_option_names": ["-h", "--help"]})
def agent_command() -> None:
    """The device side of `--on HOST` (run over ssh by the workstation's vitdeploy; not for direct use).

    \b
    Example:
      vitdeploy remote-agent hello
      vitdeploy remote-agent index ~/.cache/vitdeploy/remote/digits-0123456789/bundle
    """


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _root(path: str) -> Path:
    import os

    return Path(os.path.expanduser(path)).resolve()


@agent_command.command("hello")
@click.option("--index", "roots", multiple=True, help="Also list the files of this folder (created if missing). Repeatable.")
def _hello(roots: Tuple[str, ...]) -> None:
    """Version, formats, Python and host of this device, as JSON (and the listing of --index folders)."""
    from .agent import hello, index

    info = hello()
    info["index"] = {}
    for root in roots:
        path = _root(root)
        info["index"][root] = {"root": str(path), "files": index(path)}
    _print_json(info)


@agent_command.command("index")
@click.argument("root")
def _index(root: str) -> None:
    """sha256 of every file under ROOT (created if missing), from the hash manifest where unchanged."""
    from .agent import index

    path = _root(root)
    _print_json({"root": str(path), "files": index(path)})


@agent_command.command("receive")
@click.argument("root")
def _receive(root: str) -> None:
    """Unpack a checked tar stream from stdin into ROOT (nothing moves unless all of it arrived)."""
    from .agent import TransferError, receive

    try:
        result = receive(_root(root), click.get_binary_stream("stdin"))
    except TransferError as exc:
        click.echo(f"error: {exc}; nothing was moved into {root}", err=True)
        sys.exit(1)
    _print_json(result)


@agent_command.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("workdir")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def _run(workdir: str, args: Tuple[str, ...]) -> None:
    """Run `vitdeploy ARGS` in WORKDIR; stop it when stdin (the workstation's connection) closes."""
    from .agent import run_command

    words = list(args)
    if words[:1] == ["--"]:  # Click keeps the separator among UNPROCESSED arguments
        words = words[1:]
    sys.exit(run_command(_root(workdir), words))


@agent_command.command("send")
@click.argument("root")
@click.argument("paths", nargs=-1)
@click.option("--changed", is_flag=True, help="Only files changed since the last index (what the command just wrote).")
@click.option("--whole", multiple=True, help="Sub-folders of this folder travel whole (engines).")
def _send(root: str, paths: Tuple[str, ...], changed: bool, whole: Tuple[str, ...]) -> None:
    """Write the files under PATHS (relative to ROOT; all when none) to stdout as a checked tar stream."""
    from .agent import send

    out = click.get_binary_stream("stdout")
    send(_root(root), paths, out, changed=changed, whole=whole)
    out.flush()
