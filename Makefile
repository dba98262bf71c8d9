# Two commands for a fresh machine (no GPU needed): `make demo` and `make test`.
# Each creates .venv when missing and installs the CPU torch wheel (torch==2.13.0), not a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fusedrope-installed

.PHONY: demo test bench aot clean

$(STAMP): pyproject.toml requirements-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-cpu.txt
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)  ## the main job: backends, selection, self-check, timing
	$(PY) -m fusedrope

test: $(STAMP)  ## the whole CPU test suite (Triton kernels in the interpreter)
	$(PY) -m pytest -q

bench: $(STAMP)  ## pytest-benchmark suites: both ops' backends side by side, and the host overhead
	$(PY) -m pytest bench/ --benchmark-only -q

aot: $(STAMP)  ## ahead-of-time Triton compiles for sm_90 / gfx942 / gfx950, with access-width counts
	env -u TRITON_INTERPRET $(PY) tests/triton_aot.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
