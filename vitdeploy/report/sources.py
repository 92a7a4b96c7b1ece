"""What the report reads: the bundle (its graphs verified against the manifest) and the records the
other commands left in ``reports/`` and ``engines/``.

Nothing here computes evidence; a record that is missing stays missing (the page names the command
that makes it), and a record that cannot be read is named, not guessed at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..bundle import Bundle
from ..errors import UserError


@dataclass
class Record:
    """One JSON record: its path relative to the bundle (what ``data-src`` names) and its contents."""

    rel: str
    data: dict[str, Any]


@dataclass
class Sources:
    bundle: Bundle
    graph_sha: dict[str, str]  # precision -> sha256 of the graph on disk (verified against the manifest)
    check: list[Record] = field(default_factory=list)
    evaluate: Record | None = None
    occlusion: list[Record] = field(default_factory=list)
    profile: Record | None = None
    engines: dict[str, Record | None] = field(default_factory=dict)  # target -> engine.json (None: no fingerprint)
    engine_plans: list[Record] = field(default_factory=list)
    dla: list[Record] = field(default_factory=list)
    recipes: list[Record] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # "path: why"

    def image(self, rel: str | Path) -> bytes | None:
        path = self.bundle.root / rel
        try:
            data = path.read_bytes()
        except OSError:
            return None
        return data if data.startswith(b"\x89PNG\r\n\x1a\n") else None

    def native(self) -> tuple[int, int]:
        """The size the model was trained at (older and hand-made manifests record only the graph's height and width)."""
        res = self.bundle.manifest["resolution"]
        h, w = res.get("native") or (res.get("height"), res.get("width"))
        if h is None or w is None:
            h, w = self.bundle.spec.image_size
        return int(h), int(w)

    def is_current(self, precision: str | None, sha: str | None) -> bool:
        """Evidence is current when the graph it measured is the one the manifest holds now."""
        return bool(sha) and self.graph_sha.get(precision or "") == sha


def open_sources(path: str | Path) -> Sources:
    bundle = Bundle.open(path)
    if bundle.bare_onnx is not None:
        raise UserError(f"{path} is a bare ONNX file; `vitdeploy report` reads a bundle folder (its manifest and reports/); "
                        "export with -o DIR")
    # every graph is hashed and compared with the manifest: a report never vouches for a swapped file
    graph_sha = {}
    for precision in bundle.precisions() + (["cpu"] if bundle.artifact("cpu") else []):
        bundle.artifact_path(precision)
        graph_sha[precision] = bundle.artifact_sha256(precision)
    src = Sources(bundle, graph_sha)
    reports = bundle.reports_dir()
    src.check = [r for r in (_load(src, p) for p in sorted(reports.glob("check*.json"))) if r]
    src.evaluate = _load(src, reports / "evaluate.json")
    src.occlusion = [r for r in (_load(src, p) for p in sorted(reports.glob("**/occlusion.json"))) if r]
    src.profile = _load(src, reports / "profile.json")
    src.engine_plans = [r for r in (_load(src, p) for p in sorted(reports.glob("engine-plan-*.json"))) if r]
    src.dla = [r for r in (_load(src, p) for p in sorted(reports.glob("dla-*.json"))) if r]
    src.recipes = [r for r in (_load(src, p) for p in sorted(reports.glob("precision-recipe-*.json"))) if r]
    for target in sorted(bundle.engines()):
        src.engines[target] = _load(src, bundle.root / "engines" / target / "engine.json")
    return src


def _load(src: Sources, path: Path) -> Record | None:
    if not path.is_file():
        return None
    rel = path.relative_to(src.bundle.root).as_posix()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        src.unreadable.append(f"{rel}: {exc.__class__.__name__}: {exc}")
        return None
    if not isinstance(data, dict):
        src.unreadable.append(f"{rel}: holds {type(data).__name__}, not a report object")
        return None
    return Record(rel, data)
