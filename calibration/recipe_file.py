"""Precision recipe files: what ``vitdeploy debug-precision`` finds, in a form the other commands take.

One JSON file per recipe (``reports/precision-recipe-<precision>.json`` by default):

* int8: ``{"format", "precision": "int8", "method", "target", "smoothing": {alpha, scope} | null,
  "keep_fp32": {"op_types", "blocks", "roles"}, ...}``. ``vitdeploy calibrate BUNDLE --recipe FILE``
  quantizes exactly that recipe (no ladder) and gates it as usual;
* fp16: ``{"format", "precision": "fp16", "keep_fp32": ["blocks.2/mlp-fc2", "Gelu", ...]}`` - what
  ``vitdeploy convert BUNDLE --precision fp16 --keep-fp32 ITEMS`` takes (op types, modules, cells),
  or ``convert --recipe FILE``;
* fp8: ``{"format", "precision": "fp8", "method", "attention", "keep_float": {"blocks", "nodes"}}`` -
  ``vitdeploy calibrate BUNDLE --precision fp8 --recipe FILE`` leaves those nodes in float.

Each also carries how they were found (gate, data, the measurements) for the reader; commands read
only the fields above. Module names and ``MODULE/ROLE`` cells (``blocks.2/mlp-fc2``) are resolved
against the graph at use, so a recipe moves to a re-export of the same model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitdeploy.errors import UserError

FORMAT = "vitdeploy-precision-recipe/1"


def write_recipe(path: str | Path, recipe: dict[str, Any]) -> Path:
    from vitdeploy.fileio import atomic_write_json

    return atomic_write_json(Path(path), {"format": FORMAT, **recipe})


def read_recipe(path: str | Path, precision: str) -> dict[str, Any]:
    """The recipe at ``path``, checked to be a ``precision`` recipe; one-line errors otherwise."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"recipe file {path} does not exist (write one with `vitdeploy debug-precision BUNDLE --precision {precision}`)")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"recipe file {path} is not readable JSON ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"{path} is not a vitdeploy precision recipe (expected \"format\": \"{FORMAT}\")")
    if data.get("precision") != precision:
        raise UserError(f"{path} is a recipe for {data.get('precision')}; this command takes a recipe for {precision}")
    return data


def int8_recipe(data: dict[str, Any]) -> Any:
    """A calibration Recipe from an int8 recipe file's fields."""
    from .exclusions import Exclusions
    from .qdq import Recipe
    from .smooth import Smoothing

    keep = data.get("keep_fp32") or {}
    if not isinstance(keep, dict):
        raise UserError("an int8 recipe's keep_fp32 must be an object with op_types, blocks, roles")
    try:
        exclusions = Exclusions(tuple(keep.get("op_types") or ()), tuple(keep.get("blocks") or ()), tuple(keep.get("roles") or ()))
        return Recipe(str(data.get("method", "entropy")), str(data.get("target", "tensorrt")), exclusions,
                      Smoothing.from_dict(data.get("smoothing")))
    except (TypeError, ValueError) as exc:
        raise UserError(f"the int8 recipe's fields are malformed ({exc})") from None


def fp16_keep(data: dict[str, Any]) -> tuple[str, ...]:
    keep = data.get("keep_fp32") or []
    if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
        raise UserError("an fp16 recipe's keep_fp32 must be a list of op types, modules or MODULE/ROLE cells")
    return tuple(keep)
