# The two entry points of the README. Each installs what it needs into .venv (harvest) and into
# engine environments cached outside the clone (scripts/install-engines), then runs.
# The interpreter .venv is built from: PY when given, else scripts/pick-python's choice, the fastest
# build on this machine of the Python version `python3` is (the suite's CPU is mostly short Python
# processes: on a 2-core AMD EPYC VM, 2026-12-07, Debian's CPython 3.11 build ran the fast tier in
# 152 s against 184 s on a pyenv build of 3.11 without profile-guided optimisation; tests/README.md).
# An existing .venv is kept whatever built it.
PY ?=
VENV ?= .venv
PYTEST_ARGS ?=
# Test processes (pytest-xdist): twice the machine's cores plus one, 3 to 16. The suite waits on
# engines, deadlines and subprocesses more than it computes: on 2 cores the whole suite kept 1.05
# cores busy with 3 workers (2026-12-06), and the fast tier took 138 s with 3, 127 s with 4 and
# 117 s with 5 (tests/README.md "The suite's time").
TEST_WORKERS ?= $(shell python3 -c 'import os; print(min(16, max(3, 2 * len(os.sched_getaffinity(0)) + 1)))')
# The pytest time each tier may take (tests/budget.py: over it a CI run fails, elsewhere it warns).
# The fast tier's budget follows the machine's speed: FAST_BUDGET_S where tests/budget.py's speed
# probe takes FAST_BUDGET_PROBE_MS, scaled by the probe's reading here (x0.5 to x3). Set on a 2-core
# AMD EPYC VM without AVX-512 (probe 4.4 ms at its best on a pyenv build of 3.11, 2026-12-07; Debian's
# build reads x0.63 of that: tests/README.md "The interpreter"): 300 s there, x2.6 of the 89-114 s
# the tier takes there since its harvest commands are forked (tests/harvest_process.py; 152-195 s
# before), 150 s on a machine twice as fast. The suite's target is 15 min; its budget is the
# 20-minute rule itself, on any machine. Figures: tests/README.md "The suite's time".
FAST_BUDGET_S ?= 300
FAST_BUDGET_PROBE_MS ?= 4.4
SUITE_BUDGET_S ?= 1200
# The suite starts hundreds of Python processes (harvest's commands, stand-in engines, child pytest
# runs): bytecode is written (into __pycache__, ignored by git) even where the environment turns it
# off, so each compiles harvest's modules once, not once per process, and each pytest-xdist worker
# reuses the others' assertion rewrites.
TEST_ENV = PYTHONDONTWRITEBYTECODE=

.PHONY: demo test test-fast install engines system

$(VENV)/.harvest-installed: pyproject.toml
	py="$(PY)"; [ -n "$$py" ] || py=$$(scripts/pick-python) || py=python3; "$$py" -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.harvest-installed

engines:
	scripts/install-engines vllm llamacpp sglang transformers

# Debian packages the tests use for real (sshd, Chromium, tmux, namespaces, mount, ps); skipped when
# already present. Under CI=true a real part missing at test time is a failure (tests/realparts.py).
system:
	scripts/install-system

# The main job on the embedded default: a tiny local model on vLLM's CPU build.
demo: install
	$(VENV)/bin/harvest demo --engine-python "$$(scripts/install-engines vllm)"

# The whole test suite against real engines; "no tests collected" (pytest exit 5) is a failure.
test: install engines system
	HARVEST_VLLM_PYTHON="$$(scripts/install-engines vllm)" \
	HARVEST_LLAMA_SERVER="$$(scripts/install-engines llamacpp)" \
	HARVEST_SGLANG_PYTHON="$$(scripts/install-engines sglang)" \
	HARVEST_TRANSFORMERS_PYTHON="$$(scripts/install-engines transformers)" \
	HARVEST_TIME_BUDGET=$(SUITE_BUDGET_S) $(TEST_ENV) $(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests collected: failing" >&2; exit 1; fi; exit $$rc

# The inner loop: unit, contract and fuzz tests - no engine, no Ray, no sshd, no GPU (tests/README.md).
# Nothing in it may skip; it fails like `make test` when nothing is collected.
FAST_MARKERS = not vllm and not transformers and not ray and not sshd and not engine and not gpu and not slow
test-fast: install
	HARVEST_SGLANG_PYTHON="$$(scripts/install-engines sglang)" \
	HARVEST_NO_SKIPS=1 HARVEST_TIME_BUDGET=$(FAST_BUDGET_S) HARVEST_TIME_BUDGET_PROBE_MS=$(FAST_BUDGET_PROBE_MS) $(TEST_ENV) $(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "$(FAST_MARKERS)" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests collected: failing" >&2; exit 1; fi; exit $$rc
