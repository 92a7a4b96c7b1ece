"""`vitdeploy costs`."""

from __future__ import annotations

from pathlib import Path

import click

from ..spec import ViTSpec, parse_resolution
from .common import command, echo_json, split_csv
from .options import json_option


@command("costs")
@click.argument("source", required=False)
@click.option("--resolutions", default=None, help="Comma-separated N or HxW (default: the model's native size).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@json_option("the table")
@click.option("--merge-tokens", "merge_tokens", multiple=True, metavar="R|R1,R2,...",
              help="Also the cost of token merging with this schedule (r per block, or one r per block; repeatable); "
                   "a merged bundle shows its own schedule.")
def command(source, resolutions, batch, as_json, merge_tokens):
    """Analytic cost of a ViT across resolutions (chapter §39.5): N, L, L^2, MACs, attention share, params.

    SOURCE is a bundle, a vitdeploy .onnx, or a model source (builtin:digits by default, timm:<model>, hf:<dir>).

    \b
    Example:
      vitdeploy costs timm:vit_base_patch16_224 --resolutions 224,384
      vitdeploy costs digits-bundle --json
      vitdeploy costs timm:vit_base_patch16_224 --merge-tokens 4 --merge-tokens 8 --merge-tokens 13
    """
    from ..costs import costs_table
    from ..describe import print_costs

    from ..costs import merge_costs, parse_merge_schedule

    spec, title = _resolve_spec(source)
    sizes = [parse_resolution(r) for r in split_csv(resolutions)] or [tuple(spec.image_size)]
    for h, w in sizes:
        spec.grid(h, w)  # one clear line for a size the patches don't tile
    schedules = [parse_merge_schedule(text, spec.depth) for text in merge_tokens] or _bundle_schedule(source)
    merged = [(h, w, [merge_costs(spec, s, h, w, batch) for s in schedules]) for h, w in sizes] if schedules else []
    if as_json:
        echo_json({"source": title, "spec": spec.to_dict(), "batch": batch, "rows": [r.to_dict() for r in costs_table(spec, sizes, batch)],
                   **({"token_merge": [{"height": h, "width": w, "schedules": [m.to_dict() for m in ms]} for h, w, ms in merged]}
                      if merged else {})})
    else:
        print_costs(spec, sizes, batch, title)
        if schedules:
            from ..describe import print_merge_costs

            for h, w, _ in merged:
                print_merge_costs(spec, schedules, h, w, batch)


def _bundle_schedule(target: str | None) -> list[tuple[int, ...]]:
    """A merged bundle's own schedule (manifest ``token_merge``), else none."""
    if target and Path(target).is_dir() and (Path(target) / "manifest.json").exists():
        from ..bundle import Bundle

        record = Bundle.open(target).manifest.get("token_merge")
        if record:
            return [tuple(record["schedule"])]
    return []


def _resolve_spec(target: str | None) -> tuple[ViTSpec, str]:
    """The spec of a bundle, a vitdeploy .onnx, or a model source (builtin:/timm:/hf:/ref:). Here, at the top:
    a model source is loaded by the exporters, which the core below them may not import."""
    if target and Path(target).exists() and (Path(target).is_dir() and (Path(target) / "manifest.json").exists() or target.endswith(".onnx")):
        from ..bundle import Bundle

        bundle = Bundle.open(target)
        return bundle.spec, str(target)
    from ..errors import UserError

    text = target or "builtin:digits"
    if text.startswith("builtin:"):
        # builtin configs are JSON: no torch needed to know their shape
        from ..builtin import get_builtin

        return ViTSpec.from_dict(get_builtin(text.split(":", 1)[1]).load_config()["spec"]), text
    if ":" not in text:
        raise UserError(f"{text!r} is neither a bundle, a .onnx file, nor a source like timm:<model>")
    from vitdeploy.exporters.sources import load_source

    # the cost of an architecture needs no weights: timm/hf sources are built (seeded) without them
    kind = text.split(":", 1)[0]
    return load_source(text, random_init=kind in ("timm", "hf")).spec, text
