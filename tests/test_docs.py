"""The documentation: README as a landing page, the site built with warnings as errors and no broken
internal link, a generated reference page per command, and every shell example either run here
(offline, on the bundled digits model) or marked with what it needs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple
from urllib.parse import unquote, urlsplit

import pytest

from doc_blocks import Block, blocks
from doc_cli_cache import CACHE_ENV as DOCS_EXPORT_CACHE

ROOT = Path(__file__).resolve().parents[1]
README_MAX_BYTES = 15 * 1024
PROSE_LINE_MAX = 400
ALL_BLOCKS = blocks(ROOT)
SHELL_BLOCKS = [b for b in ALL_BLOCKS if b.is_shell]


def _prose_lines(text: str) -> List[str]:
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def test_readme_is_a_landing_page() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= README_MAX_BYTES, f"README.md is {len(text.encode())} bytes (at most {README_MAX_BYTES})"
    long = [line[:60] for line in _prose_lines(text) if len(line) > PROSE_LINE_MAX]
    assert not long, f"README lines over {PROSE_LINE_MAX} characters outside code blocks: {long}"
    setup = [b.text for b in ALL_BLOCKS if b.path.name == "README.md" and b.is_shell]
    assert any(re.search(r"^make demo\b", t, re.M) for t in setup) and any(re.search(r"^make test\b", t, re.M) for t in setup)


def test_every_fence_declares_a_language() -> None:
    # an unlabelled fence could hide a shell example from the runner below
    bare = [b.id for b in ALL_BLOCKS if not b.language]
    assert not bare, f"fenced blocks without a language (bash/console for shell, text for the rest): {bare}"


def test_every_command_has_a_generated_reference_page() -> None:
    from vitdeploy.cli import main

    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for name, command in main.commands.items():
        if command.hidden:
            continue
        page = ROOT / "docs" / "commands" / f"{name}.md"
        assert page.is_file(), f"no docs/commands/{name}.md for `vitdeploy {name}`"
        text = page.read_text(encoding="utf-8")
        assert "::: mkdocs-click" in text and f":module: {command.callback.__module__}" in text, page
        assert f"commands/{name}.md" in nav, f"docs/commands/{name}.md is not in mkdocs.yml's nav"


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: Set[str] = set()
        self.links: List[str] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Any]]) -> None:
        values = dict(attrs)
        for key in ("id", "name") if tag != "meta" else ():
            if values.get(key):
                self.ids.add(values[key])
        for key in ("href", "src"):
            if values.get(key) and tag != "link" or (tag == "link" and key == "href" and values.get("rel") == "stylesheet"):
                if values.get(key):
                    self.links.append(values[key])


def broken_internal_links(site: Path) -> Tuple[int, List[str]]:
    """(internal links checked, broken ones) over every page of a built site: the target file exists and
    the fragment names an element of it."""
    site = site.resolve()
    pages: Dict[Path, _Links] = {}
    for page in site.rglob("*.html"):
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        pages[page.resolve()] = parser
    checked, broken = 0, []
    for page, parser in pages.items():
        for link in parser.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("data:", "javascript:", "mailto:")):
                continue
            base = site if parts.path.startswith("/") else page.parent  # 404.html links from the site's root
            target = (base / unquote(parts.path).lstrip("/")).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            checked += 1
            if not target.exists():
                broken.append(f"{page.relative_to(site.resolve())}: {link}")
            elif parts.fragment and target.suffix == ".html":
                if target not in pages or unquote(parts.fragment) not in pages[target].ids:
                    broken.append(f"{page.relative_to(site.resolve())}: {link} (no such anchor)")
    return checked, broken


@pytest.mark.slow
def test_site_builds_strict_with_no_broken_internal_link(tmp_path: Path) -> None:
    site = tmp_path / "site"
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
                         capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    page = (site / "commands" / "export.html").read_text(encoding="utf-8")
    assert "--dynamic-resolution" in page and "--random-init" in page  # the option reference came from the CLI
    checked, broken = broken_internal_links(site)
    print(f"internal links checked: {checked}, broken: {len(broken)}")
    assert checked > 500 and not broken, broken[:20]


def test_the_link_checker_finds_a_broken_link_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_text('<a id="top" href="b.html#here">b</a><a href="gone.html">x</a><a href="b.html#nowhere">y</a>')
    (tmp_path / "b.html").write_text('<h2 id="here">here</h2><a href="a.html#top">a</a><a href="https://example.org/x">ext</a>')
    checked, broken = broken_internal_links(tmp_path)
    assert checked == 4 and sorted(broken) == ["a.html: b.html#nowhere (no such anchor)", "a.html: gone.html"]


def test_shell_blocks_run_or_say_what_they_need() -> None:
    needs = [b for b in SHELL_BLOCKS if b.needs]
    runs = [b for b in SHELL_BLOCKS if not b.needs]
    print(f"documentation shell blocks: {len(runs)} run in tests/test_docs.py, {len(needs)} marked '# needs: ...'")
    assert runs and needs
    vague = [b.id for b in needs if len(b.needs) < 8]
    assert not vague, f"a needs mark must say what is needed: {vague}"


@pytest.fixture(scope="session")
def cli_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the `vitdeploy` the blocks run: the installed CLI, with exports of a built-in model
    that another block already ran with the same flags copied from the run's cache (tests/doc_cli_cache.py)."""
    folder = tmp_path_factory.mktemp("docs-cli")
    script = folder / "vitdeploy"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).with_name("doc_cli_cache.py")}" "$@"\n')
    script.chmod(0o755)
    return folder


def _workdir(tmp: Path, digits: Path, cli: Path, export_cache: Path) -> Dict[str, str]:
    """The reader's folder: the demo's bundle and a few images under the names the docs use, the
    checkout's scripts and examples, and an empty, offline Hugging Face cache; `vitdeploy` is `cli`'s."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    for name in ("demo-bundle", "bundle"):
        shutil.copytree(digits, tmp / name)
    digits8 = load_digits()
    (tmp / "photos").mkdir()
    for i in range(4):
        img = Image.fromarray((digits8.images[i] * 255 / 16).astype(np.uint8)).convert("RGB").resize((32, 32))
        img.save(tmp / "photos" / f"{i}.png")
    shutil.copy(tmp / "photos" / "0.png", tmp / "digit.png")
    shutil.copy(tmp / "photos" / "1.png", tmp / "frame.png")
    for name in ("scripts", "examples", "bench"):
        (tmp / name).symlink_to(ROOT / name)
    (tmp / ".venv").symlink_to(Path(sys.executable).parent.parent)
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": os.pathsep.join([str(cli), bin_dir, os.environ.get("PATH", "")]), "HF_HUB_OFFLINE": "1",
            "HF_HOME": str(tmp / "hf-home"), "VITDEPLOY_ORT_THREADS": "1", "MPLBACKEND": "Agg",
            DOCS_EXPORT_CACHE: str(export_cache)}


@pytest.mark.slow
@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=[b.id for b in SHELL_BLOCKS])
def test_shell_block(block: Block, tmp_path: Path, digits_bundle: Any, cli_dir: Path, artifact_cache: Any) -> None:
    if block.needs:
        pytest.skip(f"{block.id} needs: {block.needs}")
    env = _workdir(tmp_path, Path(digits_bundle.root), cli_dir, artifact_cache.root)
    run = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.script()], cwd=tmp_path, env=env,
                         capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, f"{block.id} exited {run.returncode}:\n{block.script()}\n--- stderr ---\n{run.stderr[-3000:]}"


def test_the_blocks_cli_serves_only_repeated_builtin_exports(tmp_path: Path) -> None:
    from doc_cli_cache import cacheable, split_output

    assert split_output(["builtin:digits", "-o", "b", "--merge-tokens", "4"]) == ("b", ["builtin:digits", "--merge-tokens", "4"])
    assert split_output(["--output=b", "--outputs", "embedding"]) == ("b", ["--outputs", "embedding"])
    assert split_output(["-ob", "-o", "c"])[0] is None  # twice: not understood, so never served
    assert cacheable(["export", "-o", "feat", "--outputs", "embedding"], tmp_path) == ("feat", ["--outputs", "embedding"])
    (tmp_path / "exists").mkdir()
    (tmp_path / "model.safetensors").write_bytes(b"")
    for args in (["export", "builtin:digits", "-o", "exists"],  # the CLI carries engines over: run it for real
                 ["export", "ref:model.safetensors", "-o", "b"], ["export", "timm:vit_tiny_patch16_224", "-o", "b"],
                 ["export", "-o", "b", "--fp16-data", "model.safetensors"],  # a file of the block's folder
                 ["export", "-o", "b", "timm:vit_tiny_patch16_224"],  # a source after the options
                 ["check", "bundle"], ["export", "--help"], ["export", "builtin:digits"]):
        assert cacheable(args, tmp_path) is None, args


def test_a_failing_export_is_not_kept_and_fails_the_same_way_again(tmp_path: Path, cli_dir: Path) -> None:
    env = {**os.environ, DOCS_EXPORT_CACHE: str(tmp_path / "cache"), "PATH": f"{cli_dir}{os.pathsep}{os.environ['PATH']}"}
    runs = [subprocess.run(["vitdeploy", "export", "builtin:nothing", "-o", "b"], cwd=tmp_path, env=env, capture_output=True,
                           text=True) for _ in range(2)]
    assert [r.returncode for r in runs] == [runs[0].returncode] * 2 and runs[0].returncode != 0
    assert runs[0].stderr == runs[1].stderr and "nothing" in runs[0].stderr and "Traceback" not in runs[0].stderr
    assert not (tmp_path / "b").exists() and not list((tmp_path / "cache").glob("*/.artifact-stamp.json"))
