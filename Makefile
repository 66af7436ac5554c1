# The two set-up commands of the README:
#   make demo   installs everything and runs the main job on the embedded defaults
#   make test   installs everything and runs the test suite
VENV    ?= .venv
PY      := $(VENV)/bin/python
OUT     ?= out
STAMP   := $(VENV)/.installed

.PHONY: demo test test-machines setup lint bytecode clean

$(STAMP): pyproject.toml setup.py counterd/_native/*.c
	bash scripts/system-deps.sh
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# The package's bytecode, written beforehand: where PYTHONDONTWRITEBYTECODE is set (as on the CI
# hosts) every process the tests, the demo and `predict --pilot` start would otherwise compile
# counterd's sources again (import + init: 0.16 s without, 0.09 s with, measured), and under
# Callgrind at a hundred times that. Up to date, it costs 40 ms.
bytecode: $(STAMP)
	$(PY) -m compileall -q counterd predictor microbench

demo: bytecode
	mkdir -p $(OUT)
	$(VENV)/bin/counterd probe
	$(VENV)/bin/microbench run --quick --out $(OUT)/quick.json --force
	$(VENV)/bin/predict calibrate --results $(OUT)/quick.json --out $(OUT)/node.toml --force
	$(VENV)/bin/counterd record --backend sim --out $(OUT)/example.jsonl -- $(PY) examples/bsp_sum.py
	$(VENV)/bin/counterd report --records $(OUT)/example.jsonl --profile $(OUT)/node.toml
	$(VENV)/bin/counterd report --records $(OUT)/example.jsonl --profile $(OUT)/node.toml \
		--out $(OUT)/example.html

test: lint bytecode
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The suite as if on each machine file of tests/machine_files (a 2-CPU AMD guest with a 32 MB
# L3, a 2-CPU Intel guest with a 300 MB L3, a 2-socket 64-CPU node): once per file, with
# COUNTERD_MACHINE naming it. `COUNTERD_MACHINE=FILE make test` runs it as if on one.
MACHINE_FILES := $(wildcard tests/machine_files/*.toml)

test-machines: lint bytecode
	@failed=; for f in $(MACHINE_FILES); do \
		echo "== COUNTERD_MACHINE=$$f"; \
		COUNTERD_MACHINE=$$f $(PY) -m pytest -q $(PYTEST_ARGS) || failed="$$failed $$f"; \
	done; \
	if [ -n "$$failed" ]; then echo "== failed under:$$failed"; exit 1; fi

# Style, types and the layering contracts (pyproject.toml [tool.importlinter]); part of `make test`.
lint: $(STAMP)
	$(VENV)/bin/ruff check counterd predictor microbench tests bench examples
	$(VENV)/bin/mypy counterd predictor microbench
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info $(OUT)
