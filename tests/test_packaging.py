"""Packaging: lazy imports, --help without heavy modules, the installed package layout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchvision", "timm", "transformers", "onnxruntime", "tensorrt", "pycuda", "cuda", "onnxscript")

BLOCKER = textwrap.dedent(
    f"""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in {HEAVY!r}:
                raise ImportError(f"blocked for the test: {{name}}")
            return None
    sys.meta_path.insert(0, Block())
    """
)


def run_blocked(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_every_help_works_without_torch_onnxruntime_tensorrt():
    result = run_blocked(
        """
        from click.testing import CliRunner
        from vitdeploy.cli import main
        runner = CliRunner()
        top = runner.invoke(main, ["--help"])
        assert top.exit_code == 0, top.output
        names = sorted(main.commands)
        for name in names:
            r = runner.invoke(main, [name, "--help"])
            assert r.exit_code == 0, (name, r.output)
            assert "Example:" in r.output, name
        print(",".join(names))
        """
    )
    assert result.returncode == 0, result.stderr
    commands = set(result.stdout.strip().split(","))
    assert {"export", "check", "costs", "inspect"} <= commands


def test_missing_torch_is_one_line_not_a_traceback(tmp_path):
    result = run_blocked(
        f"""
        from click.testing import CliRunner
        from vitdeploy.cli import main
        r = CliRunner().invoke(main, ["export", "timm:vit_tiny_patch16_224", "-o", {str(tmp_path / 'b')!r}])
        print(r.exit_code)
        print(r.output)
        """
    )
    assert result.returncode == 0, result.stderr
    code, *lines = result.stdout.strip().splitlines()
    assert code == "1"
    assert "Traceback" not in result.stdout
    assert any("pip install" in line for line in lines)


def test_core_imports_stay_light():
    result = run_blocked(
        """
        import vitdeploy, vitdeploy.bundle, vitdeploy.costs, vitdeploy.spec, vitdeploy.compare, vitdeploy.runtime
        import vitdeploy.engine, vitdeploy.checks.protocol, vitdeploy.images
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr


def test_subpackages_import_from_the_installed_layout():
    result = subprocess.run([sys.executable, "-c", "import vitdeploy.exporters, vitdeploy.calibration; print(vitdeploy.exporters.__file__)"],
                            capture_output=True, text=True, cwd="/", timeout=120)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).parent == ROOT / "exporters"  # editable install maps the top-level folder


@pytest.mark.slow
def test_normal_install_maps_exporters_and_calibration(tmp_path):
    """A non-editable install (a built wheel) puts exporters/ and calibration/ under vitdeploy/."""
    target = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", "--target", str(target), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    assert (target / "vitdeploy" / "exporters" / "api.py").is_file()
    assert (target / "vitdeploy" / "calibration").is_dir()
    assert not (target / "exporters").exists() and not (target / "calibration").exists()
    env = dict(os.environ, PYTHONPATH=str(target))
    check = subprocess.run([sys.executable, "-c", "import vitdeploy.exporters, vitdeploy.calibration, vitdeploy.builtin; print(vitdeploy.__file__)"],
                           capture_output=True, text=True, cwd="/", env=env, timeout=120)
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip().startswith(str(target))
    assert (target / "vitdeploy" / "builtin" / "digits.safetensors").is_file()
