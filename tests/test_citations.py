"""Citations a reader can follow (issue 36): a URL, or a GitHub repository and a path in it.

No file of the project may point at a private search tool's index or its record ids (a reader cannot
open those); every reference `vitdeploy targets --sources` prints is a URL or `owner/repo path`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from click.testing import CliRunner

from vitdeploy.cli import main
from vitdeploy.engine import jetpack

ROOT = Path(__file__).resolve().parents[1]
# written so that this file does not match itself: a backslash is not a word character, 'W' is
UNFOLLOWABLE = [re.compile(r"\bsearch\W+index", re.I), re.compile(r"\bindex\W+ids?\W+\d{5,}", re.I)]
URL = re.compile(r"^https?://[^\s/]+\.[^\s]+")
REPO_PATH = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+ [\w.-]+(/[\w.-]+)*\.\w+\b")  # owner/repo path/to/file.ext


def followable(reference: str) -> bool:
    return bool(URL.match(reference) or REPO_PATH.match(reference))


def _project_text_files() -> list:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True, timeout=120).stdout.decode().split("\0")
    files = []
    for name in filter(None, listed):
        path = ROOT / name
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        data = path.read_bytes()
        if b"\0" not in data[:8192]:
            files.append((name, data.decode(errors="replace")))
    return files


def test_no_file_cites_a_search_index():
    files = _project_text_files()
    assert any(name == "vitdeploy/engine/jetpack.py" for name, _ in files)  # really the project's files
    found = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
             for name, text in files for pattern in UNFOLLOWABLE for m in pattern.finditer(text)]
    assert found == [], found


def test_every_source_is_a_url_or_a_repository_path():
    bad = {key: ref for key, ref in jetpack.SOURCES.items() if not followable(ref)}
    assert bad == {}, bad
    used = {key for row in jetpack.RELEASES for key in row.sources} | {key for m in jetpack.MODULES.values() for key in m.sources}
    used |= set(jetpack.GENERAL_SOURCES)
    assert used <= set(jetpack.SOURCES), used - set(jetpack.SOURCES)  # no row names a source that is not listed
    assert set(jetpack.SOURCES) <= used, set(jetpack.SOURCES) - used  # and none is listed for nothing


def test_targets_sources_prints_only_followable_references():
    result = CliRunner().invoke(main, ["targets", "--sources"])
    assert result.exit_code == 0, result.output
    references = dict(re.findall(r"^\[([\w.-]+)\] (.+)$", result.output, re.M))
    assert set(references) == set(jetpack.SOURCES)  # every row of the matrix: every source is printed
    assert [key for key, ref in references.items() if not followable(ref)] == []


def test_the_reference_check_tells_the_two_kinds_apart():
    assert followable("https://docs.nvidia.com/jetson/archives/r38.2.1/DeveloperGuide/index.html (what it says)")
    assert followable("dusty-nv/jetson-containers jetson_containers/l4t_version.py (third party)")
    assert followable("NVIDIA/TensorRT CHANGELOG.md (main)")
    assert not followable("a public repository's environment log (third party)")
    assert not followable("NVIDIA TensorRT 8.6 Developer Guide, 'Hardware Compatibility'")
