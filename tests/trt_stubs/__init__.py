"""Test tooling: gcc-built stand-ins for TensorRT's native libraries, so the real TensorRT Python
bindings of several versions import on a machine without TensorRT or a GPU. Never shipped."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "stubs.c"
# Binding versions the tests load; the install script puts each in <root>/<version>/.
BINDING_VERSIONS = ("8.6.1", "10.3.0", "10.13.3.9", "10.16.1.11", "11.4.0.106")
_LIBS = {"libnvinfer": "LIB_NVINFER", "libnvinfer_plugin": "LIB_PLUGIN", "libnvonnxparser": "LIB_ONNXPARSER"}


def source_key() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


def build_stubs(cache_root: Path, major: int) -> Path:
    """Compile the stand-ins for TensorRT ``major`` into ``cache_root/<key>/<major>`` (once)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise FileNotFoundError("no C compiler (gcc/cc) to build the TensorRT stand-in libraries")
    out = cache_root / source_key() / str(major)
    if (out / ".complete").exists():
        return out
    tmp = out.with_name(f"{major}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    libs = dict(_LIBS)
    if major < 10:
        libs["libnvparsers"] = "LIB_PARSERS"
    for lib, flag in libs.items():
        soname = f"{lib}.so.{major}"
        subprocess.run([gcc, "-shared", "-fPIC", "-O0", f"-D{flag}", f"-Wl,-soname,{soname}", "-o", str(tmp / soname), str(SOURCE)], check=True)
    (tmp / ".complete").touch()
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def bindings_root(repo: Path) -> Path:
    return Path(os.environ.get("VITDEPLOY_TRT_BINDINGS") or repo / ".venv" / "trt-bindings")


def probe_env(bindings_dir: Path, stub_dir: Path, repo: Path) -> dict[str, str]:
    """Environment for a subprocess that imports one bindings version over the stand-ins."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(bindings_dir), str(repo), str(HERE.parent)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(stub_dir)] + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
    env.pop("VITDEPLOY_TRT_BINDINGS", None)
    return env


PYTHON = sys.executable


def installed_bindings(repo: Path, version: str, cache_root: Path) -> tuple[Path, Path]:
    """(bindings folder, stand-in libraries) for ``version``; skips the test when either is missing."""
    import pytest

    bindings = bindings_root(repo) / version
    if not (bindings / "tensorrt_bindings" / "__init__.py").is_file():
        pytest.skip(f"TensorRT {version} bindings not installed in {bindings.parent}: run scripts/install_trt_bindings.sh "
                    f"{bindings.parent} (make setup does)")
    try:
        return bindings, build_stubs(cache_root, int(version.split(".")[0]))
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
