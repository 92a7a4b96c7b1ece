"""The extras never install both ONNX Runtime builds (issue 36).

`onnxruntime` (CPU) and `onnxruntime-gpu` install the same `onnxruntime` module and overwrite each
other (microsoft/onnxruntime#26996). The package's own metadata (Requires-Dist with its markers, as
setuptools writes it into the wheel) is evaluated for every combination docs/INSTALL.md tells a user
to install, on the Pythons and machines the project supports: none may bring both builds.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import textwrap
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
INSTALL_DOC = ROOT / "docs" / "INSTALL.md"
BUILDS = {"onnxruntime", "onnxruntime-gpu"}
# The Pythons (JetPack 5's 3.8, JetPack 6's 3.10, the workstation's newest) and machines supported.
ENVIRONMENTS = [{"python_version": v, "python_full_version": f"{v}.0", "platform_machine": m, "sys_platform": "linux",
                 "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
                 "platform_python_implementation": "CPython"}
                for v in ("3.8", "3.10", "3.12", "3.13") for m in ("x86_64", "aarch64")]


@pytest.fixture(scope="module")
def metadata(tmp_path_factory) -> dict:
    """Provides-Extra and Requires-Dist of the wheel setuptools would build from this checkout."""
    out = tmp_path_factory.mktemp("metadata")
    code = f"import setuptools.build_meta as b; print(b.prepare_metadata_for_build_wheel({str(out)!r}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    info = Parser().parsestr((out / result.stdout.strip().splitlines()[-1] / "METADATA").read_text())
    return {"name": info["Name"], "extras": set(info.get_all("Provides-Extra") or []),
            "requires": [Requirement(r) for r in info.get_all("Requires-Dist") or []]}


def resolve(metadata: dict, extras: set, env: dict) -> set:
    """The distributions `pip install NAME[extras]` asks for directly in ``env`` (self-references expanded)."""
    extras, seen = set(extras), None
    while seen != extras:
        seen = set(extras)
        for req in metadata["requires"]:
            if req.name == metadata["name"] and _applies(req, extras, env):
                extras |= req.extras
    return {req.name.lower() for req in metadata["requires"] if req.name != metadata["name"] and _applies(req, extras, env)}


def _applies(req: Requirement, extras: set, env: dict) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate(dict(env, extra=extra)) for extra in sorted(extras | {""}))


def documented_combinations() -> list:
    """Every `vitdeploy[...]` docs/INSTALL.md names (and the bare core), as sets of extras."""
    text = INSTALL_DOC.read_text()
    found = {frozenset(e.strip() for e in m.group(1).split(",")) for m in re.finditer(r"vitdeploy\[([a-z0-9_,\- ]+)\]", text)}
    return sorted(found | {frozenset()}, key=sorted)


def test_the_documented_combinations_are_the_ones_users_need(metadata):
    combos = set(documented_combinations())
    assert {frozenset(c) for c in ({"cpu"}, {"gpu"}, {"cpu", "export"}, {"gpu", "export"}, {"serve", "cpu"}, {"dev"})} <= combos
    unknown = set().union(*combos) - metadata["extras"]
    assert not unknown, f"docs/INSTALL.md names extras the package does not provide: {unknown}"


def test_no_documented_combination_installs_both_onnxruntime_builds(metadata):
    for extras in documented_combinations():
        for env in ENVIRONMENTS:
            builds = resolve(metadata, set(extras), env) & BUILDS
            assert len(builds) <= 1, (sorted(extras), env["python_version"], env["platform_machine"], builds)
            if {"cpu", "dev"} & extras:
                assert builds == {"onnxruntime"}, (sorted(extras), builds)
            elif "gpu" in extras:
                assert builds == {"onnxruntime-gpu"}, (sorted(extras), builds)
            else:  # the core and the other extras leave the choice of build to the user (Jetson: NVIDIA's wheel)
                assert builds == set(), (sorted(extras), builds)


def test_only_gpu_beside_cpu_or_dev_would_bring_both(metadata):
    """Every combination of extras, documented or not: two builds only where gpu is named beside an
    extra that carries the CPU build (what docs/INSTALL.md says never to do), so a new extra that
    pulled in ONNX Runtime would show up here."""
    names = sorted(metadata["extras"])
    assert {"cpu", "gpu", "export", "serve", "dev"} <= set(names)
    for n in range(len(names) + 1):
        for extras in map(set, itertools.combinations(names, n)):
            for env in ENVIRONMENTS:
                both = BUILDS <= resolve(metadata, extras, env)
                assert both == ("gpu" in extras and bool({"cpu", "dev"} & extras)), (sorted(extras), env)


def test_a_missing_onnxruntime_is_one_line_naming_both_extras(digits_bundle, tmp_path):
    """The core alone (a Jetson before NVIDIA's wheel is installed): running a bundle says what to install."""
    from PIL import Image

    image = tmp_path / "x.png"
    Image.new("RGB", (32, 32)).save(image)
    code = textwrap.dedent(
        f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] == "onnxruntime":
                    raise ImportError("No module named 'onnxruntime'", name=name)
        sys.meta_path.insert(0, Block())
        from click.testing import CliRunner
        from vitdeploy.cli import main
        r = CliRunner().invoke(main, ["predict", {str(digits_bundle.root)!r}, {str(image)!r}, "--backend", "onnxruntime"])
        print(r.exit_code)
        print(r.output)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    code_line, *lines = result.stdout.strip().splitlines()
    assert code_line == "1" and len(lines) == 1 and "Traceback" not in result.stdout, result.stdout
    assert "vitdeploy[cpu]" in lines[0] and "vitdeploy[gpu]" in lines[0] and "never both" in lines[0], lines[0]
