# Two commands do all set-up on a fresh machine:
#   make demo   - create .venv, install, run the pipeline on the bundled digits model
#   make test   - create .venv, install, run the whole test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_DIR ?= demo-bundle

.PHONY: setup demo test clean

$(STAMP): pyproject.toml constraints.txt scripts/install_trt_bindings.sh
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# constraints.txt pins torch/torchvision to the builds on this machine's disk (tests and CI only)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	# the real TensorRT Python bindings of four versions, one folder each, for the API tests
	PYTHON=$(BIN)/python bash scripts/install_trt_bindings.sh $(VENV)/trt-bindings
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH bash scripts/demo.sh $(DEMO_DIR)

test: $(STAMP)
	# Debian packages for the C++ example's library tests (root or sudo; skipped tests say why otherwise)
	bash scripts/install_system_deps.sh || echo "warning: could not install the C++ example's Debian packages (needs root or sudo); tests/test_cpp_example.py will fail"
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO_DIR)
