"""The on-device subset: what a Jetson's Python (3.8 on JetPack 5.1, 3.10 on JetPack 6) can install and run.

- vermin (target 3.8, annotations unevaluated) and a check for run-time PEP 604/585 type expressions
  over the core (scripts/check_device_subset.sh vermin);
- the built wheel's dependencies resolve for Python 3.8 and 3.10 on aarch64 from binary wheels only
  (scripts/check_device_subset.sh resolve; asks PyPI);
- every core module imports with the workstation and GPU packages blocked;
- on a Python older than the workstation side needs, a torch step fails in one line that says where to run it.
"""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_device_subset.sh"

# Not on the device: the torch reference ViT (workstation-only, excluded from vermin too).
WORKSTATION_ONLY = {"vitdeploy.model", "vitdeploy.posembed"}
BLOCKED = ("torch", "torchvision", "timm", "transformers", "onnxscript", "onnxslim", "onnxconverter_common", "sklearn",
           "onnxruntime", "tensorrt", "pycuda", "cuda", "pytriton", "tritonclient")

BLOCKER = textwrap.dedent(
    f"""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in {BLOCKED!r}:
                raise ImportError(f"blocked for the test: {{name}}", name=name)
            return None
    sys.meta_path.insert(0, Block())
    """
)


def _script(*args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env=dict(os.environ, PYTHON=sys.executable))  # keeps any proxy settings pip needs


# vermin parses every core module (about 4 s of CPU on a quiet machine, 5.4 s at load average 3), too
# close to the fast tier's 5 s to stay there; `make test` runs it.
@pytest.mark.slow
def test_core_is_valid_python_3_8():
    result = _script("vermin", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Target versions not met" not in result.stdout, result.stdout
    assert "none that needs more than Python 3.8" in result.stdout


def test_runtime_type_expression_check_catches_what_vermin_misses(tmp_path):
    """The AST half of the vermin step must really reject `tuple[...]`/`X | None` evaluated at run time."""
    fake = tmp_path / "vitdeploy"
    fake.mkdir()
    (fake / "ok.py").write_text("from __future__ import annotations\ndef f(x: list[int] | None) -> dict[str, int]: ...\n")
    (fake / "bad.py").write_text("from __future__ import annotations\nTriple = tuple[int, int, int]\nMaybe = int | None\n")
    (fake / "bad_unpostponed.py").write_text("def f(x: list[int]) -> None: ...\n")
    body = SCRIPT.read_text().split("\"$PYTHON\" - <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    result = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 1
    flagged = result.stdout.splitlines()
    assert any("bad.py:2" in line and "tuple[...]" in line for line in flagged), flagged
    assert any("bad.py:3" in line and "X | Y" in line for line in flagged), flagged
    assert any("bad_unpostponed.py:1" in line for line in flagged), flagged
    assert not any("ok.py" in line for line in flagged), flagged


@pytest.mark.slow
def test_wheel_resolves_for_jetpack_pythons_on_aarch64_from_binary_wheels():
    result = _script("resolve", "3.8", "3.10", timeout=600)
    out = result.stdout + result.stderr
    if result.returncode != 0 and ("NewConnectionError" in out or "Temporary failure in name resolution" in out):
        pytest.fail(f"PyPI is not reachable from here; this check needs it: {out[-500:]}")
    assert result.returncode == 0, out
    lines = {line.split(" ")[1]: line for line in result.stdout.splitlines() if line.startswith("python ")}
    assert set(lines) == {"3.8", "3.10"}, result.stdout
    # JetPack 5's Python 3.8 gets the last releases that support it; nothing needs a compiler.
    assert "numpy 1.24." in lines["3.8"] and "onnxruntime 1.19." in lines["3.8"], lines["3.8"]
    for line in lines.values():
        assert "binary wheels only" in line and "onnx " in line and "pillow " in line


def _core_modules() -> list[str]:
    import vitdeploy

    names = []
    for info in pkgutil.walk_packages(vitdeploy.__path__, "vitdeploy."):
        if info.name in WORKSTATION_ONLY or info.name.startswith("vitdeploy.exporters") or info.name.startswith("vitdeploy.calibration"):
            continue
        names.append(info.name)
    return names


def test_every_core_module_imports_without_workstation_or_gpu_packages():
    modules = _core_modules()
    assert {"vitdeploy.runtime.classifier", "vitdeploy.engine.service", "vitdeploy.profile.tegrastats",
            "vitdeploy.remote.session", "vitdeploy.cli.cmd_predict"} <= set(modules)
    code = BLOCKER + textwrap.dedent(
        f"""
        import importlib
        failed = []
        for name in {modules!r}:
            try:
                importlib.import_module(name)
            except Exception as exc:
                failed.append(f"{{name}}: {{type(exc).__name__}}: {{exc}}")
        print("\\n".join(failed) or "ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok", result.stdout


def test_workstation_step_on_an_older_python_is_one_line():
    """On JetPack 5's Python 3.8 the `export` extra installs nothing; export says where to run instead of `pip install`."""
    code = BLOCKER + textwrap.dedent(
        """
        import vitdeploy.lazy
        vitdeploy.lazy.WORKSTATION_PYTHON = (sys.version_info[0], sys.version_info[1] + 1)  # pretend this Python is too old
        from click.testing import CliRunner
        from vitdeploy.cli import main
        r = CliRunner().invoke(main, ["export", "timm:vit_tiny_patch16_224", "-o", "unused"])
        print(r.exit_code)
        print(r.output)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    code_line, *lines = result.stdout.strip().splitlines()
    assert code_line == "1"
    assert len(lines) == 1 and "Traceback" not in result.stdout, lines
    need = f"{sys.version_info[0]}.{sys.version_info[1] + 1}"
    assert f"needs Python >= {need}" in lines[0] and "--on HOST" in lines[0], lines[0]


PY38_VENV = ROOT / ".venv-py38"  # made by `make test` / `bash scripts/check_device_subset.sh py38-env .venv-py38`


def py38_vitdeploy() -> Path:
    """The vitdeploy of the Python 3.8 venv (JetPack 5's Python), or skip when this machine has no 3.8."""
    exe = PY38_VENV / "bin" / "vitdeploy"
    if exe.exists():
        return exe
    found = _script("find-python38", timeout=60).stdout.strip()
    if found:
        pytest.fail(f"Python 3.8 is here ({found}) but {PY38_VENV} is not: run `make setup` or "
                    f"`bash scripts/check_device_subset.sh py38-env .venv-py38`")
    pytest.skip("no Python 3.8 interpreter on this machine (PY38, python3.8 or pyenv); the resolution check still ran")


@pytest.mark.slow
def test_core_runs_on_python_3_8(digits_bundle, copy_bundle, tmp_path):
    """The on-device commands, run by a real CPython 3.8 with the core's 3.8 dependencies (numpy 1.24, onnx 1.17, ORT 1.19)."""
    import numpy as np
    from PIL import Image

    exe = py38_vitdeploy()
    python = exe.parent / "python"
    assert subprocess.run([str(python), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True,
                          timeout=60).stdout.strip() == "(3, 8)"
    # every command's --help, and no torch anywhere in that environment
    helps = subprocess.run([str(python), "-c", textwrap.dedent(
        """
        import importlib.util
        from click.testing import CliRunner
        from vitdeploy.cli import main
        assert importlib.util.find_spec("torch") is None
        for name in sorted(main.commands):
            r = CliRunner().invoke(main, [name, "--help"])
            assert r.exit_code == 0 and "Example:" in r.output, (name, r.output)
        print(len(main.commands))
        """)], capture_output=True, text=True, timeout=300)
    assert helps.returncode == 0, helps.stderr
    bundle = copy_bundle(digits_bundle)
    image = tmp_path / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(image)

    def run(*args: str, exe: Path = exe) -> subprocess.CompletedProcess:
        return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300, cwd=tmp_path)

    import json

    there = run("predict", str(bundle), str(image), "--json", "--backend", "onnxruntime")
    here = run("predict", str(bundle), str(image), "--json", "--backend", "onnxruntime", exe=Path(sys.executable).parent / "vitdeploy")
    assert there.returncode == 0 and here.returncode == 0, there.stderr
    top_there, top_here = json.loads(there.stdout)[0]["top"], json.loads(here.stdout)[0]["top"]
    assert [t["label"] for t in top_there] == [t["label"] for t in top_here]
    assert np.allclose([t["prob"] for t in top_there], [t["prob"] for t in top_here], atol=1e-5)

    profile = run("profile", str(bundle), "--iterations", "3", "--warmup", "1", "--threads", "1", "--no-plot", "--json")
    assert profile.returncode == 0, profile.stderr
    assert [c["status"] for c in json.loads(profile.stdout)["cells"]] == ["ok"]
    plan = run("build-engine", str(bundle), "--dry-run", "--trt-version", "10.3")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert list((bundle / "reports").glob("engine-plan-*.json"))
