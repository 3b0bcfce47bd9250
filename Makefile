# Two entry points for a fresh machine: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned to a `+cpu` build on machines without an NVIDIA driver, so that installing never
# pulls a multi-GB CUDA build. GPU users: see README, "Keeping your own CUDA torch".
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
STEPS ?= 20
# e.g. VENV_ARGS=--system-site-packages to see a CUDA torch installed outside the venv
VENV_ARGS ?=

.PHONY: demo test test-timed test-compiled test-fast test-frameworks lint install install-dev install-frameworks clean-traces

$(BIN)/python:
	$(PYTHON) -m venv $(VENV_ARGS) $(VENV)

$(VENV)/.torch: | $(BIN)/python
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "ranktrace: keeping the installed torch $$($(BIN)/python -c 'import torch; print(torch.__version__)')"; \
	elif command -v nvidia-smi >/dev/null 2>&1; then \
		$(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)"; \
	else \
		$(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
		|| $(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)+cpu" --extra-index-url "$(TORCH_CPU_INDEX)"; \
	fi
	@touch $@

install: $(VENV)/.torch
	$(BIN)/python -m pip install -q -e .

install-dev: $(VENV)/.torch
	$(BIN)/python -m pip install -q -e ".[dev]"

install-frameworks: $(VENV)/.torch
	$(BIN)/python -m pip install -q -e ".[dev,frameworks]"

# the newest run folder gets report.html beside its traces, and the one-screen text report ends
# the demo: the verdict stays on the screen (`ranktrace breakdown RUN --full`: every table)
demo: install
	$(BIN)/torchrun --nproc-per-node 2 --no-python $(BIN)/ranktrace record workloads/ddp.py \
		--steps $(STEPS)
	@run=$$(ls -td traces/*/ | head -1); \
	$(BIN)/ranktrace breakdown "$$run" --html "$${run}report.html"

# two pytest-xdist workers: the integration tests wait on processes, pg timeouts and sleeps much
# of the time; tests that read one shared run stay on one worker, and the few runs of theirs whose
# timings are asserted are recorded with nothing else running (tests/conftest.py,
# tests/helpers/alone.py). The modules that assert on timings have a target of their own.
test: install-dev
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup \
		-m "not frameworks and not compiled and not timed" --durations=15

# the modules whose assertions are on timings (stragglers named, a diff's verdict, a sweep's
# efficiency, a slow phase's window; tests/conftest.py's TIMED), in one process: each run is
# recorded on a machine the rest of the suite does not load
test-timed: install-dev
	$(BIN)/python -m pytest -q -m timed --durations=10

# the traced-training identity under torch.compile: Inductor's C++ compiles on every rank of
# every run cost more CPU than any other integration module, so they are a target of their own
test-compiled: install-dev
	$(BIN)/python -m pytest -q -m compiled

# the tracer under transformers.Trainer, Lightning and accelerate (docs/frameworks.md): its own
# extra and target, so that `make test` needs none of them and stays within its time
test-frameworks: install-frameworks
	$(BIN)/python -m pytest -q tests/integration/frameworks

# the inner loop: leaves out the tests that start torchrun or other Python processes; on two
# pytest-xdist workers (50 s on the 2-core machine, 2026-12-05). pytest keeps the test modules
# it rewrites (for its assertion messages) as bytecode: where the shell turns bytecode off, it
# rewrites all of them in every run and worker (5 s of the minute), so this target writes it.
test-fast: install-dev
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n 2 -m "not slow"

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/lint-imports

clean-traces:
	find traces -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
