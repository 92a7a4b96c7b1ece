"""Edits tests make to a copied bundle on purpose."""

from __future__ import annotations

import json
from pathlib import Path

from vitdeploy.fileio import sha256_file


def vouch_for(root: str | Path, precision: str = "fp32") -> None:
    """Record a planted graph's sha256 in the manifest, as an exporter with a bug would: the planted fault
    then stands for a graph the manifest vouches for wrongly, which `check` must catch by its numbers
    (a graph the manifest does not vouch for is refused before anything runs)."""
    root = Path(root)
    manifest = json.loads((root / "manifest.json").read_text())
    record = manifest["artifacts"][precision]
    record["sha256"] = sha256_file(root / record["file"])
    record["bytes"] = (root / record["file"]).stat().st_size
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
