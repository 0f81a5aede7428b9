# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each creates or refreshes .venv from pyproject.toml before it runs.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.vsup-installed
DEMO_HOME ?= .demo/home
PYTEST_ARGS ?=

.PHONY: all venv test test-fast demo demo-attach demo-down bench clean

all: test

venv: $(STAMP)

# The CPU build of vLLM pulls torchvision, torchaudio and torchcodec built for CUDA torch;
# beside the CPU torch they break every import of transformers model code, so they go.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,cpu]'
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(PY) -c "import vllm, textual, httpx, supervisor" 
	touch $(STAMP)

test: venv
	$(PY) -m pytest $(PYTEST_ARGS)

# Everything except the tests that start real vLLM servers: for quick iterations only.
test-fast: venv
	$(PY) -m pytest -m "not vllm and not tmux" $(PYTEST_ARGS)

demo: venv
	VSUP_HOME=$(DEMO_HOME) $(PY) -m supervisor.demo

demo-attach: venv
	VSUP_HOME=$(DEMO_HOME) $(PY) -m supervisor tui

demo-down: venv
	VSUP_HOME=$(DEMO_HOME) $(PY) -m supervisor down

bench: venv
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) .demo .bench .pytest_cache .hypothesis
