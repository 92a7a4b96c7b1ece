#!/usr/bin/env bash
# The on-device subset of vitdeploy (runtime, build-engine, profile, predict, check of engines) must
# install and run on what JetPack ships: Python 3.8 on aarch64 (JetPack 5.1, Ubuntu 20.04, glibc 2.31)
# and Python 3.10 (JetPack 6, Ubuntu 22.04, glibc 2.35). Two checks, both run by
# tests/test_device_subset.py (so `make test` runs them) and usable by hand:
#
#   bash scripts/check_device_subset.sh vermin          # the core's syntax and stdlib use need <= 3.8
#   bash scripts/check_device_subset.sh resolve 3.8 3.10 # the built wheel's dependencies resolve from
#                                                        # aarch64 binary wheels only (needs PyPI)
#   bash scripts/check_device_subset.sh                  # both
#   bash scripts/check_device_subset.sh py38-env DIR     # a Python 3.8 venv (JetPack 5's Python) with the
#                                                        # core installed from this checkout, when a 3.8
#                                                        # interpreter is here (PY38, python3.8, pyenv)
#
# `resolve` builds the wheel, then asks pip what it would install (the core with the `cpu` extra, the
# CPU build of ONNX Runtime from PyPI; docs/INSTALL.md) for that Python on that platform
# (--dry-run, --only-binary=:all:, so no source build could hide a missing wheel) and prints the
# resolved versions. Environment: PYTHON (default .venv/bin/python), ARCH (default aarch64).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
ARCH=${ARCH:-aarch64}
cd "$ROOT"

run_vermin() {
    # vermin.ini holds the rules: target 3.8, annotations unevaluated (every core module has
    # `from __future__ import annotations`), the torch reference ViT excluded (workstation-only).
    "$PYTHON" -c 'import sys; from vermin import main; sys.argv[0] = "vermin"; sys.exit(main())' \
        --config-file vermin.ini --no-tips vitdeploy/
    # vermin does not see PEP 604/585 types used at run time (`X = int | None`, `isinstance(v, int | str)`,
    # `Alias = list[int]`): those fail on 3.8 even with the __future__ import, so look for them here.
    "$PYTHON" - <<'EOF'
import ast, pathlib, re, sys

EXCLUDED = re.compile(r"(^|/)vitdeploy/(model|posembed)\.py$")
GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}
TYPES = GENERICS | {"int", "float", "str", "bytes", "bool", "complex", "Path", "None", "object"}


def annotation_nodes(tree):
    """Every node inside an annotation (never evaluated under `from __future__ import annotations`)."""
    seen = set()
    for node in ast.walk(tree):
        roots = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            roots.append(node.returns)
            args = node.args
            for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if a is not None:
                    roots.append(a.annotation)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        for root in roots:
            if root is not None:
                seen.update(id(n) for n in ast.walk(root))
    return seen


def is_type(node):
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    if isinstance(node, ast.Name) and node.id in TYPES:
        return True
    if isinstance(node, ast.Subscript):
        return isinstance(node.value, ast.Name) and node.value.id in GENERICS
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and (is_type(node.left) or is_type(node.right))


problems = []
for path in sorted(pathlib.Path("vitdeploy").rglob("*.py")):
    if EXCLUDED.search(path.as_posix()):
        continue
    tree = ast.parse(path.read_text(), str(path))
    postponed = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
                    for n in tree.body)
    # without `from __future__ import annotations` 3.8 evaluates annotations too: check them all
    in_annotation = annotation_nodes(tree) if postponed else set()
    for node in ast.walk(tree):
        if id(node) in in_annotation:
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and (is_type(node.left) or is_type(node.right)):
            problems.append(f"{path}:{node.lineno}: `X | Y` type union evaluated at run time needs Python 3.10 (use typing.Optional/Union)")
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in GENERICS:
            # list[int] outside an annotation is evaluated; typing.List etc. work on 3.8
            if not isinstance(getattr(node, "ctx", None), ast.Store):
                problems.append(f"{path}:{node.lineno}: `{node.value.id}[...]` evaluated at run time needs Python 3.9 (use typing.{node.value.id.capitalize()})")
if problems:
    print("\n".join(problems))
    sys.exit(1)
print("run-time type expressions: none that needs more than Python 3.8")
EOF
}

# manylinux tags a device with this glibc accepts (pip does not expand --platform by itself).
platforms_for() {
    local glibc_minor=$1 tags=(--platform "manylinux2014_$ARCH") m
    for ((m = 17; m <= glibc_minor; m++)); do
        tags+=(--platform "manylinux_2_${m}_$ARCH")
    done
    echo "${tags[@]}"
}

resolve_one() {
    local pyver=$1 wheel=$2 out=$3 glibc
    case "$pyver" in
        3.8) glibc=31 ;;   # JetPack 5.1: Ubuntu 20.04
        *) glibc=35 ;;     # JetPack 6: Ubuntu 22.04
    esac
    # shellcheck disable=SC2046
    "$PYTHON" -m pip install --dry-run --quiet --ignore-installed --only-binary=:all: \
        --python-version "$pyver" --implementation cp $(platforms_for "$glibc") \
        --target "$out/target-$pyver" --report "$out/report-$pyver.json" "$wheel[cpu]" \
        >"$out/log-$pyver.txt" 2>&1 || { grep -v "is ignored" "$out/log-$pyver.txt" >&2; return 1; }
    "$PYTHON" - "$pyver" "$out/report-$pyver.json" <<'EOF'
import json, sys
pyver, path = sys.argv[1], sys.argv[2]
installs = json.load(open(path))["install"]
names = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}
heavy = sorted(n for n in names if n in ("torch", "torchvision", "timm", "transformers"))
if heavy:
    sys.exit(f"python {pyver}: the core pulled in workstation packages {heavy}")
if "onnxruntime" in names and "onnxruntime-gpu" in names:
    sys.exit(f"python {pyver}: both ONNX Runtime builds in the resolution (they install the same module)")
wheels = [i["download_info"]["url"].rsplit("/", 1)[-1] for i in installs]
sdists = [w for w in wheels if not w.endswith(".whl")]
if sdists:
    sys.exit(f"python {pyver}: source distributions in the resolution: {sdists}")
core = ("numpy", "onnx", "onnxruntime", "pillow", "matplotlib", "click", "rich", "safetensors", "sympy", "threadpoolctl")
print(f"python {pyver} aarch64 (binary wheels only): " + ", ".join(f"{n} {names[n]}" for n in core if n in names))
EOF
}

run_resolve() {
    local versions=("$@") work wheel pids=() status=0
    [[ ${#versions[@]} -gt 0 ]] || versions=(3.8 3.10)
    work=$(mktemp -d)
    trap 'rm -rf "$work"' RETURN
    "$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w "$work" . >"$work/build.log" 2>&1 \
        || { cat "$work/build.log" >&2; return 1; }
    wheel=$(ls "$work"/vitdeploy-*.whl)
    # one pip per Python version, in parallel: each is mostly waiting on PyPI
    for v in "${versions[@]}"; do
        resolve_one "$v" "$wheel" "$work" >"$work/out-$v.txt" 2>&1 &
        pids+=($!)
    done
    for i in "${!versions[@]}"; do
        if ! wait "${pids[$i]}"; then status=1; fi
        cat "$work/out-${versions[$i]}.txt"
    done
    return $status
}

# A Python 3.8 interpreter: $PY38, python3.8 on PATH, or pyenv's newest 3.8.x. Prints nothing if none.
find_python38() {
    local candidate
    for candidate in "${PY38:-}" "$(command -v python3.8 || true)" \
        $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.8*/bin/python 2>/dev/null | sort -V | tail -1); do
        if [[ -n "$candidate" && -x "$candidate" ]] && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 8))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
}

make_py38_env() {
    local dir=${1:?usage: $0 py38-env DIR} py
    py=$(find_python38)
    if [[ -z "$py" ]]; then
        echo "py38-env: no Python 3.8 interpreter here (set PY38=/path/to/python3.8); tests that run the core on 3.8 skip" >&2
        return 0
    fi
    rm -rf "$dir"
    "$py" -m venv "$dir"
    # the core and the CPU build of ONNX Runtime (no workstation extras): what `pip install 'vitdeploy[cpu]'`
    # gives a JetPack 5 device; editable so the tests run this checkout's code
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[cpu]' 2>&1 | grep -v "is ignored" >&2 || true
    "$dir/bin/vitdeploy" --version >/dev/null || { echo "py38-env: the install in $dir failed" >&2; return 1; }
    echo "py38-env: $dir ($("$dir/bin/python" --version 2>&1), $("$dir/bin/python" -c 'import numpy, onnx, onnxruntime; print("numpy", numpy.__version__, "onnx", onnx.__version__, "onnxruntime", onnxruntime.__version__)'))"
}

case "${1:-all}" in
    vermin) run_vermin ;;
    resolve) shift; run_resolve "$@" ;;
    all) run_vermin && run_resolve 3.8 3.10 ;;
    py38-env) shift; make_py38_env "$@" ;;
    find-python38) find_python38 ;;
    *) echo "usage: $0 [vermin | resolve [PYVER...] | py38-env DIR | find-python38 | all]" >&2; exit 2 ;;
esac
