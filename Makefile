# One command each: `make test` (set up + run the tests, then compile every kernel they ran
# interpreted for sm_90), `make demo` (set up + train on generated data).
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python

.PHONY: venv test lint demo clean

$(VPY):
	$(PY) -m venv $(VENV)

venv: $(VPY)
	@$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q --no-cache-dir torch==2.13.0
	$(VPY) -m pip install -q --no-cache-dir -e '.[test]'

lint: venv
	$(VPY) -m ruff check hashrec tests benchmarks

test: venv
	$(VPY) -m ruff check hashrec tests benchmarks
	@mkdir -p build && rm -f build/launches.jsonl
	HASHREC_LAUNCH_LOG=$(CURDIR)/build/launches.jsonl $(VPY) -m pytest -q -x -n 2 --dist loadfile -p tests.compile_check
	$(VPY) -m tests.compile_check build/launches.jsonl

demo: venv
	$(VPY) -m hashrec.tools.demo

clean:
	rm -rf $(VENV) build *.egg-info
