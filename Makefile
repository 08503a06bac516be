# `make test` and `make demo` set everything up themselves: a fresh clone needs nothing installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-at demo lint typecheck unit bench bench-packages chaos chaos-nats chaos-grpc clean system-packages grpc-v2 audit-cluster

$(STAMP): pyproject.toml setup.py commitlog/_native.c protocol/_native.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,spark,chaos]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy --strict

# Debian packages beyond Python's (fuse3 for the power-loss faults, haproxy for the group's front): installed when
# missing, see the script
system-packages:
	@sh scripts/system-packages.sh

# the stock RocketMQ 5.x Python SDK in a venv of its own (.venv/rocketmq5), for the gRPC interop tests
SDK5_STAMP := $(VENV)/rocketmq5/requirements.sha256

$(SDK5_STAMP): $(STAMP) tests/interop/sdk5-requirements.txt
	$(BIN)/python -m tests.interop.sdk5

# the stock RocketMQ 5.x Node.js SDK (npm ci into tests/interop/sdk5_node/node_modules, ignored by git), for the
# gRPC interop tests: installed when missing or when its package-lock.json changed, so no network once installed
NODE_SDK5_STAMP := tests/interop/sdk5_node/node_modules/.raftmq-package-lock.sha256

$(NODE_SDK5_STAMP): $(STAMP) tests/interop/sdk5_node/package-lock.json
	$(BIN)/python -m tests.interop.sdk5_nodejs

# two workers (pytest-xdist), a test file each at a time: most tests wait on processes (elections, polls), so
# the suite takes about 60% of its serial time on two cores; `.venv/bin/pytest` alone runs serially
unit: $(STAMP) system-packages $(SDK5_STAMP) $(NODE_SDK5_STAMP)
	$(BIN)/pytest -n 2 --dist loadfile

# regenerate broker/v2/protocol/ from broker/v2/proto/ (the generated modules are committed)
grpc-v2: $(STAMP)
	PYTHON=$(BIN)/python sh scripts/generate-grpc-v2.sh

test: lint typecheck unit

# the whole suite with the wall clock of every Python process it starts moved to DATE (local time), e.g.
#   make test-at DATE="2026-11-25 20:28:00"   (the 25th: UNIQ_KEY's time field wraps at 20:31:23.648)
test-at: $(STAMP)
	@test -n "$(DATE)" || { echo "usage: make test-at DATE='YYYY-MM-DD HH:MM:SS'"; exit 2; }
	@target=$$(date -d "$(DATE)" +%s) || exit 2; \
	RAFTMQ_TEST_CLOCK_OFFSET_NS=$$(( (target - $$(date +%s)) * 1000000000 )) PYTHONPATH=$(CURDIR)/tests/clock \
		$(MAKE) --no-print-directory test

demo: $(STAMP) system-packages
	$(BIN)/raftmq demo

# a live three-member group audited by a Spark standalone cluster (a master, two workers) on this machine:
# clean, then with one byte of a follower's segment flipped (README: "A live group, over the network")
audit-cluster: $(STAMP)
	$(BIN)/python -m cli.audit_demo

# the system packages plus nats-server, broker_bench.py's reference: a failure here is not fatal (it skips NATS)
bench-packages:
	-@sh scripts/system-packages.sh bench

bench: $(STAMP) bench-packages
	$(BIN)/python bench/store_bench.py
	$(BIN)/python bench/replication_bench.py
	$(BIN)/python bench/broker_bench.py
	$(BIN)/python bench/grpc_bench.py
	$(BIN)/python bench/timer_bench.py
	$(BIN)/python bench/verify_bench.py

# every chaos scenario for several minutes each (a soak run, not part of make test)
CHAOS_SCENARIOS := kill-leader pause-leader partition-leader partition-random kill-all-restart power-loss \
	power-loss-leader-paused wipe-follower slow-link disk-full disk-full-leader corrupt-follower kill-during-compaction corrupt-minority \
	partition-client-leader client-link-reset slow-client-link clock-skew mixed
CHAOS_DURATION ?= 300
CHAOS_SEED ?= 1

chaos: $(STAMP) system-packages
	@failed=""; for scenario in $(CHAOS_SCENARIOS); do \
		$(BIN)/raftmq chaos run --scenario $$scenario --duration $(CHAOS_DURATION) --seed $(CHAOS_SEED) \
			--report chaos-report/$$scenario || failed="$$failed $$scenario"; \
	done; if [ -n "$$failed" ]; then echo "chaos: not clean:$$failed"; exit 1; fi

# the power-loss scenario against a three-node NATS JetStream cluster (the same schedule and workload), to put
# beside raftmq's: its verdict is NATS's, so only a usage error (exit 2, e.g. no nats-server) fails the target
chaos-nats: $(STAMP) system-packages bench-packages
	@$(BIN)/raftmq chaos run --scenario power-loss --system nats --duration $(CHAOS_DURATION) --seed $(CHAOS_SEED) \
		--report chaos-report/power-loss-nats; test $$? -ne 2

# a chaos run whose workload uses the 5.x gRPC protocol for part of its producers and consumers (chaos/grpc_workload.py)
CHAOS_GRPC_SCENARIO ?= mixed
chaos-grpc: $(STAMP) system-packages
	RAFTMQ_CHAOS_GRPC=1 RAFTMQ_CHAOS_GRPC_SCENARIO=$(CHAOS_GRPC_SCENARIO) RAFTMQ_CHAOS_GRPC_SECONDS=$(CHAOS_DURATION) \
		$(BIN)/pytest tests/chaos/test_grpc_workload.py -k any_scenario -s

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache tests/interop/sdk5_node/node_modules
