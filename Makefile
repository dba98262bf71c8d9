# Two commands for a fresh machine (no GPU needed): `make demo` and `make test`.
# Each creates .venv when missing and installs torch==2.13.0 (requirements-cpu.txt): the CPU wheel where pip finds
# one (the CI image has it locally); elsewhere `make test TORCH_INDEX=https://download.pytorch.org/whl/cpu` gets
# the CPU build instead of PyPI's default Linux wheel, the multi-GB CUDA one.
PYTHON ?= python3
JOBS ?= 2  # pytest-xdist worker processes for `make test` (one per core of the 2-core CI machine)
TORCH_INDEX ?=
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fusedrope-installed

.PHONY: demo test test-slow bench aot checks clean

$(STAMP): pyproject.toml requirements-cpu.txt requirements-callers.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-cpu.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e ".[test,triton]"
	$(PY) -m pip install -q --no-deps -r requirements-callers.txt
	touch $(STAMP)

# The compiled checks of both ops' plain calls (fusedrope/csrc/fast_checks.cpp): about 15 s the first time, then
# cached. Without a C++ compiler every call takes the Python checks, and tests/test_fast_checks.py skips, saying why.
checks: $(STAMP)  ## build the compiled checks (the host cost of a call: docs/design.md)
	-$(PY) -m fusedrope build --checks

demo: checks  ## the main job: backends, selection, self-check, timing
	$(PY) -m fusedrope

test: checks  ## the CPU test suite but the tests marked slow (Triton kernels in the interpreter), JOBS processes
	$(PY) -m pytest -q -m "not slow" -n $(JOBS)

test-slow: checks  ## the tests marked slow (AddressSanitizer runs, compiles, mutated kernels, ...: docs/testing.md)
	$(PY) -m pytest -q -m slow

bench: checks  ## pytest-benchmark suites: both ops' backends side by side, and the host overhead
	$(PY) -m pytest bench/ --benchmark-only -q

aot: $(STAMP)  ## ahead-of-time Triton compiles for sm_90 / sm_80 / gfx942 / gfx950, with access-width counts
	env -u TRITON_INTERPRET $(PY) tests/support/triton_aot.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
