# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each creates or refreshes .venv from pyproject.toml before it runs.
#
# vsup is installed into .venv as users install it: a regular (non-editable) install of the
# wheel, beside vLLM (the CPU build) and so beside supervisord, whose import package is also
# named `supervisor`. vsup's own import package is `vsup` (the source is in supervisor/vsup/).
# Every change under supervisor/ or configs/ reinstalls it before tests, the demo or benchmarks.

PYTHON ?= python3
VENV ?= .venv
PY := $(abspath $(VENV))/bin/python
DEPS := $(VENV)/.vsup-deps
STAMP := $(VENV)/.vsup-installed
DEMO_HOME ?= .demo/home
# What `make test` runs, relative to the checkout; PYTEST_ARGS are passed on (e.g. -k, -x).
TESTS ?= tests
PYTEST_ARGS ?=
SRC := $(shell find supervisor configs -type f ! -name "*.pyc" ! -path "*/__pycache__/*" ! -path "*/.mypy_cache/*")
# The suite runs from a directory outside the checkout: nothing may depend on the cwd. The
# directory goes when the run ends (the shell's EXIT trap keeps pytest's exit status).
PYTEST = cwd="$$(mktemp -d -t vsup-cwd-XXXXXX)" && trap 'rm -rf "$$cwd"' EXIT && cd "$$cwd" && \
	VSUP_TEST_SLOW_LANES=$(TEST_LANES) \
	$(PY) -m pytest -c $(CURDIR)/pyproject.toml \
	--rootdir $(CURDIR)
# pytest rewrites the asserts of every test module it imports, ~12 CPU-s per process (each xdist
# worker collects everything), and caches the result only where bytecode may be written; it
# reads the cache either way. Where PYTHONDONTWRITEBYTECODE is set (CI's machines), one
# collection that may write it first saves each worker ~9 CPU-s. Its errors are the run's own.
CACHE_REWRITES = (cwd="$$(mktemp -d -t vsup-cwd-XXXXXX)" && cd "$$cwd" && \
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -c $(CURDIR)/pyproject.toml \
	--rootdir $(CURDIR) -p no:xdist -p no:cacheprovider --collect-only -q \
	$(addprefix $(CURDIR)/,$(TESTS)) >/dev/null 2>&1; rm -rf "$$cwd")

.PHONY: all venv deps ssh-server test test-fast test-multinode lint demo demo-attach demo-down bench clean

all: test

deps: $(DEPS)
venv: $(STAMP)

# The CPU build of vLLM pulls torchvision, torchaudio and torchcodec built for CUDA torch;
# beside the CPU torch they break every import of transformers model code, so they go.
# Bytecode: pip compiles the ~23,000 files one at a time (about half of this step's ~2 min);
# compileall does it on every core. It must be done here: a machine with
# PYTHONDONTWRITEBYTECODE set (CI's) would otherwise compile vLLM and torch at every start.
$(DEPS): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q 'hatchling>=1.24' build
	$(PY) -m pip install -q --no-compile --no-build-isolation '.[test,lint,cpu,router]'
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
	touch $(DEPS)

# The check finds vLLM without importing it (~6 s of torch and vLLM; the install test runs it).
$(STAMP): $(DEPS) $(SRC)
	$(PY) -m pip install -q --no-deps --no-build-isolation --force-reinstall .
	cd / && $(PY) -c "import importlib.util, textual, httpx, vsup, supervisor.options; \
		assert importlib.util.find_spec('vllm'), 'vllm is not installed'; \
		assert 'site-packages' in vsup.__file__, vsup.__file__"
	touch $(STAMP)

# The fleet tests run their own sshd (Debian's openssh-server); this installs it where it can.
ssh-server:
	@sh tests/integration/fleet/install-sshd.sh

# Lanes on xdist workers (tests/conftest.py): the real-vLLM, tmux and install modules split over
# TEST_WORKERS lanes by their cost, each lane running one module at a time, in file order, then
# every other test file, each whole on one worker. (Until 2026-12-02 the lanes were set only in
# xdist's controller, where nothing is collected: every test was a scope of its own, a module's
# tests ran on both workers with a fixture each, and test_bench's test that builds on the one
# before it failed when they landed apart.) TEST_WORKERS=0 runs all in one process (`-s`).
# Four workers on two lanes: the real-vLLM lanes (CPU-bound, two at a time on 2 cores) run while
# the two other workers take the other test files, which mostly wait on daemons and emulators
# (~1,400 worker-seconds at about a third of a core: one worker alone finished them after both
# lanes, 2026-12-06).
TEST_WORKERS ?= 4
TEST_LANES ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

# `multinode`: one server across two "nodes" (tests/integration/fleet/test_span_vllm.py, about
# 190 CPU-s: two vLLMs started twice) is not in the budgeted suite until room is made for it
# (docs/testing.md); `make test-multinode` runs it.
TEST_MARKS ?= not multinode

test: venv ssh-server
	$(if $(XDIST),$(CACHE_REWRITES))
	$(PYTEST) $(XDIST) -m "$(TEST_MARKS)" $(addprefix $(CURDIR)/,$(TESTS)) $(PYTEST_ARGS)

test-multinode: venv ssh-server
	$(PYTEST) -m multinode $(CURDIR)/tests $(PYTEST_ARGS)

# Everything except the tests that start real vLLM servers: for quick iterations only.
test-fast: venv ssh-server
	$(if $(XDIST),$(CACHE_REWRITES))
	$(PYTEST) $(XDIST) -m "not vllm and not tmux and not install and not multinode" \
		$(addprefix $(CURDIR)/,$(TESTS)) $(PYTEST_ARGS)

# mypy checks the checkout's source (not the installed copy), with pyproject.toml's [tool.mypy].
lint: deps
	$(PY) -m ruff format --check supervisor tests benchmarks
	$(PY) -m ruff check supervisor tests benchmarks
	$(PY) -m mypy --config-file pyproject.toml --cache-dir .mypy_cache supervisor/vsup tests benchmarks

demo: venv
	VSUP_HOME=$(DEMO_HOME) $(PY) -m vsup.demo --layout $(CURDIR)/layouts/cpu-demo.toml

demo-attach: venv
	VSUP_HOME=$(DEMO_HOME) $(PY) -m vsup tui

demo-down: venv
	VSUP_HOME=$(DEMO_HOME) $(PY) -m vsup down

bench: venv
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) .demo .bench .pytest_cache .hypothesis dist build
