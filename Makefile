# onceflow: the two commands a new user types are `make demo` and `make test`.
# Each does every set-up step itself (virtualenv, pinned dependencies, Kafka jars, services) and is idempotent.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.onceflow-installed
BENCH_STAMP := $(VENV)/.onceflow-bench-installed
BENCH_ARGS ?=
PYTEST_ARGS ?=
LINT_PATHS := $(wildcard src tests dags plugins spark_jobs examples bench local_stack)

.PHONY: help venv jars browser services services-stop spark demo airflow-ui test lint unit faults soak bench bench-delta bench-s3 bench-coordination bench-cdc clean

help:
	@echo "make demo           bring the local stack up and run the demo pipeline"
	@echo "make test           lint, type-check and run the whole test suite against the real services"
	@echo "make services       start Kafka, PostgreSQL, the schema registry, the warm Spark runtime and"
	@echo "                    Kafka Connect with Debezium; prints KEY=VALUE settings to eval"
	@echo "                    (ONCEFLOW_WARM_SPARK=0: no Spark runtime, slices run through spark-submit;"
	@echo "                    ONCEFLOW_KAFKA_CONNECT=0: no Kafka Connect)"
	@echo "make services-stop  stop them (data is kept in .onceflow/)"
	@echo "make airflow-ui     airflow standalone (UI on http://localhost:8080) on the local stack and DAGs"
	@echo "make lint           ruff and mypy"
	@echo "make faults         a long seeded fault run (N=200 SEED=7 EXECUTOR=local|submit); tests/faults/out/"
	@echo "make soak           every sink kind under load and a fault a minute, on 3 brokers (MINUTES=60 SEED=7); tests/faults/out/"
	@echo "make bench          benchmarks -> bench/report.md (BENCH_ARGS=\"--full\" adds 10^7 records)"
	@echo "make bench-delta    the Delta sink beside files, Iceberg and Structured Streaming's Delta sink at"
	@echo "                    10^6 and 10^7, and its commit up to 10^7 rows -> merged into bench/report.md"
	@echo "make bench-s3       files, Iceberg in the S3 bucket vs local disk, SS Parquet via S3A -> bench/report.md"
	@echo "make bench-coordination  ledger + coordinator at 1,000 partitions / 512 participants, 100 pipelines"
	@echo "make bench-cdc      10^6 Debezium changes into PostgreSQL: onceflow beside Debezium's JDBC sink"

$(STAMP): pyproject.toml constraints.txt
	@echo "[onceflow] creating virtualenv $(VENV) with $(PYTHON) and installing pinned dependencies (constraints.txt)" >&2
	@command -v $(PYTHON) >/dev/null || { echo "[onceflow] error: $(PYTHON) not found; set PYTHON=/path/to/python3.11" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q -c constraints.txt -e ".[spark,airflow,dev]"
	@touch $(STAMP)
	@echo "[onceflow] virtualenv ready" >&2

venv: $(STAMP)

# Kafka's broker jars (they hold Kafka Connect's runtime too), Kafka Connect's plugins (Debezium's
# PostgreSQL connector, Apicurio's converters), and Apicurio Registry's application where a Java 21+ can
# run it (else one line says the schema registry is left out).
jars:
	@infra/kafka.sh jars
	@if [ "$${ONCEFLOW_S3:-1}" != 0 ]; then infra/s3.sh build; fi
	@infra/connect.sh jars
	@if infra/registry.sh usable; then infra/registry.sh jars; fi

services: venv jars
	@infra/services.sh start

services-stop:
	@infra/test-stacks.sh stop
	@infra/services.sh stop

# Only the warm Spark runtime (master, two workers, Spark Connect server; `make services` starts it too);
# prints ONCEFLOW_SPARK_REMOTE=sc://...
spark: venv
	@infra/spark.sh start

lint: venv
	@echo "[onceflow] ruff" >&2
	@$(BIN)/ruff check --no-cache $(LINT_PATHS)
	@$(BIN)/ruff format --no-cache --check $(LINT_PATHS)
	@echo "[onceflow] mypy" >&2
	@$(BIN)/mypy

demo: venv jars
	@stack="$$(infra/services.sh start)" || exit 1; set -a; eval "$$stack"; set +a; \
	  PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m local_stack.demo

airflow-ui: venv jars
	@stack="$$(infra/services.sh start)" || exit 1; set -a; eval "$$stack"; set +a; \
	  PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m local_stack.local_airflow standalone

# Debian's chromium and chromedriver for the epochs console's browser tests (installed like PostgreSQL:
# by apt-get when running as root, else a line saying what to install).
browser:
	@command -v chromedriver >/dev/null && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "[onceflow] installing Debian's chromium and chromium-driver (the browser tests)" >&2; \
	  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >&2; \
	else echo "[onceflow] chromedriver not found: apt-get install chromium chromium-driver (the browser tests need it)" >&2; fi

# The local stack starts in the background while lint and the unit tests (which need no service) run;
# its progress is shown once it is up. The integration and fault tests then run in LANES lanes (pytest
# workers), each against a whole stack of its own (infra/test-stacks.sh: a lane's faults never reach
# another lane), files handed to whichever lane is free. LANES=1: one stack, one pytest process.
# PYTEST_ARGS runs pytest once, with those arguments, on one stack.
STACK_LOG := .onceflow/services-start.log
LANES ?= 2
TEST_LANES := $(if $(PYTEST_ARGS),1,$(LANES))
TEST_HOME := $(or $(ONCEFLOW_HOME),$(CURDIR)/.onceflow)
test: venv jars browser
	@mkdir -p .onceflow; echo "[onceflow] starting $(TEST_LANES) local stack(s) in the background ($(STACK_LOG))" >&2; \
	  infra/test-stacks.sh start $(TEST_LANES) 2> $(STACK_LOG) & starting=$$!; \
	  failed=0; $(MAKE) --no-print-directory lint || failed=1; \
	  if [ -z "$(PYTEST_ARGS)" ] && [ $$failed = 0 ]; then \
	    echo "[onceflow] unit tests (no services needed)" >&2; \
	    PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest tests/unit || failed=1; fi; \
	  wait $$starting; up=$$?; cat $(STACK_LOG) >&2; \
	  if [ $$up != 0 ]; then echo "[onceflow] error: the local stack did not start (above)" >&2; exit 1; fi; \
	  [ $$failed = 0 ] || exit 1; \
	  set -a; . "$(TEST_HOME)/test-stack-1.env"; set +a; \
	  if [ $(TEST_LANES) = 1 ]; then \
	    echo "[onceflow] running the integration and fault tests against the local stack" >&2; \
	    PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest $(or $(PYTEST_ARGS),--ignore=tests/unit); \
	  else \
	    echo "[onceflow] running the integration and fault tests in $(TEST_LANES) lanes, one stack each" >&2; \
	    ONCEFLOW_TEST_STACKS="$$(for n in $$(seq $(TEST_LANES)); do printf '%s ' "$(TEST_HOME)/test-stack-$$n.env"; done)" \
	      PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n $(TEST_LANES) --dist loadfile --ignore=tests/unit; \
	  fi

N ?= 100
SEED ?=
EXECUTOR ?= local
faults: venv jars
	@stack="$$(infra/services.sh start)" || exit 1; set -a; eval "$$stack"; set +a; \
	  PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m tests.faults --faults $(N) --executor $(EXECUTOR) \
	  $(if $(SEED),--seed $(SEED))

# The soak (tests/faults/soak.py): report soak-SEED.{md,json,png}; the bench extra brings matplotlib for the plot.
# It runs on a three-broker Kafka cluster, so that the cluster faults are in the catalogue
# (ONCEFLOW_KAFKA_BROKERS=1 make soak: the single broker, as the suite's 3-minute soak).
MINUTES ?= 60
soak: export ONCEFLOW_KAFKA_BROKERS ?= 3
soak: export ONCEFLOW_SPARK_LEAN ?= 0
soak: $(BENCH_STAMP) jars
	@stack="$$(infra/services.sh start)" || exit 1; set -a; eval "$$stack"; set +a; \
	  PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m tests.faults.soak --minutes $(MINUTES) $(if $(SEED),--seed $(SEED)); \
	  status=$$?; echo "[onceflow] the stack keeps running ($$ONCEFLOW_KAFKA_BROKERS Kafka broker(s)); make services-stop stops it" >&2; \
	  exit $$status

unit: venv
	@PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

$(BENCH_STAMP): $(STAMP)
	@echo "[onceflow] installing the bench extra (matplotlib, psutil, py-spy)" >&2
	@$(BIN)/python -m pip install -q -c constraints.txt -e ".[spark,airflow,dev,bench]"
	@touch $(BENCH_STAMP)

# Throughput, commit cost, epoch overhead, peers and memory; takes about an hour at the default sizes.
bench: $(BENCH_STAMP) jars
	@stack="$$(infra/services.sh start)" || exit 1; set -a; eval "$$stack"; set +a; \
	  PATH="$(CURDIR)/$(BIN):$$PATH" nice -n 10 $(BIN)/python -m bench.run $(BENCH_ARGS)

# The Delta comparison alone (step delta at 10^6 and 10^7, 3 rounds, and the Delta commit from 10^4 to 10^7
# rows), merged into bench/report.json and .md; about 30 minutes on 2 cores, more on a busy machine.
bench-delta: $(BENCH_STAMP) jars
	@stack="$$(infra/services.sh start)" || exit 1; set -a; eval "$$stack"; set +a; \
	  PATH="$(CURDIR)/$(BIN):$$PATH" nice -n 10 $(BIN)/python -m bench.run --steps delta --sizes 1e6,1e7 \
	  --commit-sizes 1e4,1e5,1e6,1e7 --runs 3 --merge $(BENCH_ARGS)

# Object storage alone (step s3 at 10^6 and 10^7, 3 rounds: files and Iceberg on the local disk and in the
# stack's bucket, Structured Streaming's Parquet through S3A; the files commit in the bucket from 10^4 to
# 10^7 rows), merged into bench/report.json and .md. The first run resolves hadoop-aws and the AWS SDK bundle.
bench-s3: $(BENCH_STAMP) jars
	@stack="$$(infra/services.sh start)" || exit 1; set -a; eval "$$stack"; set +a; \
	  PATH="$(CURDIR)/$(BIN):$$PATH" nice -n 10 $(BIN)/python -m bench.run --steps s3 --sizes 1e6,1e7 \
	  --commit-sizes 1e4,1e5,1e6,1e7 --runs 3 --merge $(BENCH_ARGS)

# Coordination at scale (ledger and coordinator, no-op committers) -> its section of bench/report.md.
bench-coordination: $(STAMP)
	@stack="$$(infra/services.sh start)" || exit 1; set -a; eval "$$stack"; set +a; \
	  nice -n 10 $(BIN)/python -m bench.coordination --report bench/report.md $(BENCH_ARGS)

# Change data capture beside Debezium's JDBC sink connector -> its section of bench/report.md. The sink
# connector is an optional Kafka Connect plugin (ONCEFLOW_CONNECT_JDBC_SINK=1), resolved only here.
bench-cdc: $(BENCH_STAMP) jars
	@stack="$$(ONCEFLOW_CONNECT_JDBC_SINK=1 infra/services.sh start)" || exit 1; set -a; eval "$$stack"; set +a; \
	  PATH="$(CURDIR)/$(BIN):$$PATH" ONCEFLOW_CONNECT_JDBC_SINK=1 nice -n 10 $(BIN)/python -m bench.cdc \
	  --report bench/report.md $(BENCH_ARGS)

clean: services-stop
	rm -rf .onceflow
