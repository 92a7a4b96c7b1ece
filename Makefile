# Two commands do all set-up on a fresh machine:
#   make demo   - create .venv, install, run the pipeline on the bundled digits model
#   make test   - create .venv, install, run the whole test suite
# and the inner loop: make test-fast (the tests not marked slow or gpu; its set-up is `make setup`)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_DIR ?= demo-bundle
# `vitdeploy serve`'s Triton environment: the system python3 (PyTriton's backend stub embeds it), numpy<2
SERVE_VENV ?= .venv-serve
SERVE_STAMP := $(SERVE_VENV)/.installed-stamp
# JetPack 5's Python 3.8 with the on-device core only (tests/test_device_subset.py, test_remote.py); skipped
# with a note when this machine has no Python 3.8
PY38_VENV ?= .venv-py38
PY38_STAMP := $(PY38_VENV)/.installed-stamp
# The compatibility lane (issue 14): a declared subset of the suite under the versions an NVIDIA PyTorch
# image ships (constraints-compat.txt: onnxruntime 1.30.0, onnx 1.23.1, timm 1.0.29, transformers 5.17),
# beside the pinned lane; torch stays on constraints.txt's builds on disk
COMPAT_VENV ?= .venv-compat
COMPAT_STAMP := $(COMPAT_VENV)/.installed-stamp
# (the version-sensitive paths: ORT quantization, calibration, check through ORT, profile on ORT and torch, timm/HF export)
COMPAT_TESTS ?= tests/test_compat.py tests/test_calibration.py tests/test_profile_sweep.py tests/test_torch_modes.py \
	tests/test_check.py::test_digits_bundle_passes_with_pytorch_accuracy tests/test_check.py::test_reduced_precision_digits_through_check \
	tests/test_export_matrix.py::test_dynamic_resolution_matches_pytorch
COMPAT_PYTEST_ARGS ?= -k "not vit_small_int8 and not within_1_2x and not compile_mode and not deit_tiny_distilled and not vit_tiny_gap"
# pytest-xdist workers for `make test` (the suite's tests pin torch to one thread each, so one worker
# per core, at most 4 for memory; tests are handed out one at a time, session fixtures are built once per worker)
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist worksteal

.PHONY: setup setup-steps serve-env demo docs test test-fast test-envs test-steps system-deps test-compat clean

$(STAMP): pyproject.toml constraints.txt scripts/install_trt_bindings.sh
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# constraints.txt pins torch/torchvision to the builds on this machine's disk (tests and CI only)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	# the real TensorRT Python bindings of four versions, one folder each, for the API tests
	PYTHON=$(BIN)/python bash scripts/install_trt_bindings.sh $(VENV)/trt-bindings
	touch $(STAMP)

$(SERVE_STAMP): pyproject.toml scripts/install_serve_env.sh
	bash scripts/install_serve_env.sh $(SERVE_VENV)
	touch $(SERVE_STAMP)

serve-env: $(SERVE_STAMP)

$(COMPAT_STAMP): pyproject.toml constraints.txt constraints-compat.txt
	test -x $(COMPAT_VENV)/bin/python || $(PY) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install -q --upgrade pip
	$(COMPAT_VENV)/bin/python -m pip install -q -c constraints.txt -c constraints-compat.txt -e '.[dev]'
	touch $(COMPAT_STAMP)

test-compat: $(COMPAT_STAMP)
	VITDEPLOY_COMPAT_LANE=1 $(COMPAT_VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) $(COMPAT_PYTEST_ARGS) $(COMPAT_TESTS)

$(PY38_STAMP): pyproject.toml scripts/check_device_subset.sh
	(bash scripts/check_device_subset.sh py38-env $(PY38_VENV) && mkdir -p $(PY38_VENV) && touch $(PY38_STAMP)) \
		|| echo "warning: the Python 3.8 venv could not be made; tests/test_device_subset.py will say why"

demo: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH bash scripts/demo.sh $(DEMO_DIR)

# The documentation site (mkdocs.yml) into build/site/, warnings as errors; the tests build it too
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

system-deps:
	# Debian packages for the C++ example's library tests and the sshd of the --on tests (root or sudo)
	bash scripts/install_system_deps.sh || echo "warning: could not install the C++ example's Debian packages and OpenSSH (needs root or sudo); tests/test_cpp_example.py and tests/test_remote.py will fail"

# The set-up steps are independent (virtual environments and the Debian packages): made side by side,
# they take the time of the longest (.venv, torch from disk) instead of the sum.
# `make setup`: what the main suite needs (.venv, the Triton serve env, Python 3.8, the Debian packages);
# `make test` adds the compatibility lane's environment.
SETUP_STEPS := $(STAMP) $(SERVE_STAMP) $(PY38_STAMP) system-deps
setup-steps: $(SETUP_STEPS)
test-steps: $(SETUP_STEPS) $(COMPAT_STAMP)

setup:
	$(MAKE) -j4 --output-sync=target setup-steps

test-envs:
	$(MAKE) -j5 --output-sync=target test-steps

# The inner loop: every test not marked `slow` (real exports at full size, trainings, the export matrix)
# or `gpu`; tests/conftest.py fails an unmarked test whose call takes over 5 s, so this tier stays fast.
# Exported bundles are cached under .pytest_cache (keyed by source, options, checkpoint contents, library
# versions and the project's source files), so a second run re-exports only what a code change touched.
test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not slow and not gpu"

test: test-envs
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) --durations=25
	$(MAKE) test-compat

clean:
	rm -rf $(VENV) $(SERVE_VENV) $(PY38_VENV) $(COMPAT_VENV) $(DEMO_DIR) $(DEMO_DIR)-images $(DEMO_DIR)-triton
