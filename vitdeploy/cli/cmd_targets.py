"""`vitdeploy targets`: the Jetson matrix (JetPack, Jetson Linux, CUDA, TensorRT, modules, DLA) and the on-device check."""

from __future__ import annotations

import click

from .common import command, echo_json
from .options import json_option


@command("targets")
@click.option("--jetpack", "jetpack_filter", metavar="X.Y", help="Only this JetPack release.")
@click.option("--module", "module_filter", metavar="KEY", help="Only this module (agx-orin, orin-nano, agx-thor, ...).")
@click.option("--sources", "show_sources", is_flag=True, help="Also print where every fact was read.")
@click.option("--check", "check", is_flag=True,
              help="On a Jetson: compare this device's Jetson Linux, module, TensorRT and Python with its JetPack row (exit 1 on a mismatch).")
@json_option(help="Print as JSON.")
def command(jetpack_filter, module_filter, show_sources, check, as_json):
    """The Jetson targets build-engine can plan for, as data with their sources.

    One row per (JetPack, module): Jetson Linux release, CUDA, the TensorRT the stack ships, the ONNX
    parser rules and lowering that TensorRT needs, the GPU's compute capability, the DLA cores that
    TensorRT can use on the module, and Python. A value no stored NVIDIA or device source confirmed is
    printed with '?'. A row's name is what `build-engine --target` takes: it plans that TensorRT (no
    TensorRT needed here) and refuses --dla-core where the module has no DLA (Jetson Thor, Orin Nano).

    \b
    Example:
      vitdeploy targets
      vitdeploy targets --jetpack 7.2 --sources
      vitdeploy targets --module agx-thor --json
      vitdeploy targets --check                      # on the Jetson
      vitdeploy build-engine bundle --dry-run --target jp7.1-agx-thor
    """
    from ..engine import jetpack, targets
    from ..errors import UserError

    if check:
        result = targets.check_this_device()
        if as_json:
            echo_json({"l4t": result.l4t, "jetpack": result.jetpack, "module": result.module.key if result.module else None,
                       "found": result.found, "problems": result.problems, "notes": result.notes, "ok": result.ok})
        else:
            for line in result.lines():
                click.echo(line)
        if not result.ok:
            click.get_current_context().exit(1)
        return

    rows = targets.all_targets()
    if jetpack_filter:
        rows = [t for t in rows if t.release.jetpack == jetpack_filter]
        if not rows:
            raise UserError(f"JetPack {jetpack_filter} is not in the matrix (known: {', '.join(r.jetpack for r in jetpack.RELEASES)})")
    if module_filter:
        rows = [t for t in rows if t.module is not None and t.module.key == module_filter]
        if not rows:
            raise UserError(f"no target has module {module_filter!r} (modules: {', '.join(jetpack.MODULES)})")
    if as_json:
        echo_json({"targets": [t.to_dict() for t in rows], "sources": jetpack.SOURCES})
        return
    from ..engine.parser_rules import rules_for

    header = ("target", "JetPack", "L4T", "CUDA", "TensorRT", "parser", "lowering", "SM", "DLA", "Python")
    table = []
    for t in rows:
        r, m = t.release, t.module
        q = lambda fact, obj=r: "?" if fact in obj.unconfirmed else ""  # noqa: E731
        rules = rules_for(r.tensorrt)
        dla_open = r.dla is not False and (("dla_cores" in m.unconfirmed) or (r.dla is None and m.dla_cores > 0))
        table.append((t.name, r.jetpack, "/".join(r.l4t) + q("l4t"), r.cuda + q("cuda"), r.tensorrt + q("tensorrt"), rules.key,
                      "opset 17" if rules.needs_lowering else "-", m.compute_capability + q("compute_capability", m),
                      f"{t.dla_cores}{'?' if dla_open else ''}", r.python + q("python")))
    widths = [max(len(str(row[i])) for row in [header] + table) for i in range(len(header))]
    for row in [header] + table:
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    click.echo("? = not confirmed by a stored source (see --sources); nothing here was run on a Jetson")
    if show_sources:
        shown = sorted({k for t in rows for k in t.release.sources + (t.module.sources if t.module else ())})
        shown += [k for k in jetpack.GENERAL_SOURCES if k not in shown]
        click.echo("")
        for t in rows:
            notes = list(t.release.notes) + (list(t.module.notes) if t.module else [])
            if notes:
                click.echo(f"{t.name}: " + "; ".join(notes))
        click.echo("")
        for key in shown:
            click.echo(f"[{key}] {jetpack.SOURCES[key]}")
