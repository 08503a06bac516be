# `make test` and `make demo` set everything up themselves: a fresh clone needs nothing installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo lint typecheck unit bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy --strict

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

demo: $(STAMP)
	$(BIN)/raftmq demo

bench: $(STAMP)
	$(BIN)/python bench/store_bench.py
	$(BIN)/python bench/replication_bench.py
	$(BIN)/python bench/broker_bench.py
	$(BIN)/python bench/timer_bench.py
	$(BIN)/python bench/verify_bench.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
