# ackkit: the targets a newcomer can guess. Every target bootstraps what it
# needs (venv, packages, a RabbitMQ binary for the throwaway test node).
#
# RabbitMQ versions: 3.10 is the machine's own rabbitmq-server; 4.0 and 4.3 run
# in a Debian root the test kit builds on first use (root + debootstrap, ~40 s,
# cached in /var/cache/ackkit/rootfs). `make test` runs everything on 3.10 and
# the broker-facing suites on 4.3 (but $(ONCE)), sharing out the runtimes between the two
# (.ci/test-legs); `make test-matrix` runs everything on each.
# `make chaos RABBITMQ=4.3`, `make bench RABBITMQ=4.3` pick the broker.
# The 4.x legs ignore AMQP_URL (they are about their version's node).
PY      := .venv/bin/python
PYTEST  := .venv/bin/pytest
STAMP   := .venv/.ackkit-installed
RABBITMQ ?= 3.10
VERSIONS := 3.10 4.0 4.3
# Suites that talk to a broker; unit tests need no second run.
BROKER_SUITES := tests/contract tests/integration tests/adversarial tests/inbox \
                 tests/chaos/test_chaos_quick.py tests/spark
# The Spark modules that run a query end to end run once, each in the Spark leg of one
# broker (see .ci/test-legs), none of them about the broker's version: on 3.10 the queue
# source's crash, cluster, deployment-change, shard-scale and slow-source-runner modules;
# on 4.3 (the version users run; super streams need 3.11+) the queue source's and the
# stream source's own modules, their kills, AvailableNow and Spark Connect. The AvailableNow
# broker side, without Spark, runs on every leg (tests/contract/test_spark_available.py);
# the Spark modules of parts and plans run on both broker legs; make test-matrix runs every
# module on every version.
SPARK310 := tests/spark/test_spark_crash.py tests/spark/test_spark_cluster.py \
            tests/spark/test_spark_deploy.py tests/spark/test_spark_scale.py \
            tests/spark/test_spark_slow_worker.py
SPARK43 := tests/spark/test_spark_available.py tests/spark/test_spark_connect.py \
           tests/spark/test_spark_cluster_streams.py tests/spark/test_spark_streams_kill.py \
           tests/spark/test_spark_stream.py tests/spark/test_spark_streams.py
# The library's own surfaces, whichever broker is below them: the console (a real
# browser), the CLI, the test kit (whose 4.x tests start a 4.3 node of their own on any
# leg), the wheel, the examples, logs and metrics. They run once, in a leg of their own on
# 3.10 (the broker's version is not what they check); make test-matrix still runs them on
# every version. The test kit's cluster (test_testkit_cluster.py) is not among them: it is
# in $(CLUSTER), below.
ONCE := $(filter-out tests/integration/test_testkit_cluster.py, \
          $(wildcard tests/integration/test_console*.py tests/integration/test_cli*.py \
          tests/integration/test_testkit*.py)) \
        tests/integration/test_docker_provider.py tests/integration/test_packaging.py \
        tests/integration/test_examples.py tests/integration/test_observability.py \
        tests/integration/test_operability.py tests/integration/test_connect_failure_lines.py \
        tests/integration/test_quiet_probes.py tests/inbox/test_outbox_relay_cli.py \
        tests/inbox/test_outbox_docs_example.py tests/inbox/test_inbox_memory_db.py
# The modules that start a 3-node cluster of the kit's own (a minute or more each, most of
# it the nodes' start): the 4.3 integration leg runs them, both runtimes (production clusters run 4.x);
# make test-matrix runs them on every version.
CLUSTER := tests/integration/test_testkit_cluster.py tests/integration/test_cluster_failover.py \
           tests/integration/test_cluster_tools.py tests/integration/test_cluster_quorum_retry.py
# The environment of a leg on RabbitMQ $(1): 3.10 keeps AMQP_URL as given.
leg_env = $(if $(filter 3.10,$(1)),,env -u AMQP_URL) ACKKIT_TEST_RABBITMQ=$(1)
RESULTS_SUFFIX := $(if $(filter 3.10,$(RABBITMQ)),,-$(RABBITMQ))

.PHONY: demo docs docs-serve test coverage test-matrix test-docker unit fuzz check bench bench-quick chaos soak clean

$(STAMP): pyproject.toml testkit/pyproject.toml .ci/bootstrap
	bash .ci/bootstrap
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo

# The documentation site (docs/, mkdocs.yml) into site/: strict, so a broken link or
# reference fails; no network needed. `make test` runs this build and every example in
# the docs (tests/docs).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict

docs-serve: $(STAMP)
	.venv/bin/mkdocs serve

test: $(STAMP)
	PYTEST=$(PYTEST) BROKER_SUITES="$(BROKER_SUITES)" SPARK310="$(SPARK310)" SPARK43="$(SPARK43)" \
	    ONCE="$(ONCE)" CLUSTER="$(CLUSTER)" bash .ci/test-legs

# make test's legs with line and branch coverage of ackkit/ (every Python process they
# start, Spark's workers too), combined at the end: the figures in the last lines, the
# report in .test-logs/coverage/ (docs/development.md). Same as ACKKIT_COVERAGE=1 make test.
coverage: $(STAMP)
	ACKKIT_COVERAGE=1 $(MAKE) --no-print-directory test

# contract + test-kit tests against RabbitMQ containers (skipped without Docker)
test-docker: $(STAMP)
	PYTEST=$(PYTEST) bash .ci/test-docker

test-matrix: $(STAMP)
	@status=0; for v in $(VERSIONS); do \
	    echo "== RabbitMQ $$v: every suite"; \
	    if [ "$$v" = 3.10 ]; then unset_url=; else unset_url="-u AMQP_URL"; fi; \
	    env $$unset_url ACKKIT_TEST_RABBITMQ=$$v $(PYTEST) tests -m "not bench" -p no:cacheprovider || status=1; \
	done; exit $$status

unit: $(STAMP)
	$(PYTEST) tests/unit -q

# Property tests with a fresh random seed and FUZZ times the examples (make test uses
# one fixed seed, printed in its header). A failing example is saved in
# tests/hypothesis-db, which make test replays: commit it with the fix.
FUZZ ?= 10
FUZZ_SUITES ?= tests/unit
fuzz: $(STAMP)
	ACKKIT_FUZZ=$(FUZZ) $(PYTEST) $(FUZZ_SUITES) -m "not bench" -p no:cacheprovider

check: $(STAMP)
	.venv/bin/ruff check ackkit testkit examples spark tests
	.venv/bin/ruff format --check ackkit testkit examples spark tests
	.venv/bin/mypy ackkit testkit/ackkit_testkit examples

bench: $(STAMP)
	$(call leg_env,$(RABBITMQ)) $(PY) -m tests.benchmarks $(if $(RESULTS_SUFFIX),--own-broker) \
	    --json bench-results/latest$(RESULTS_SUFFIX).json

bench-quick: $(STAMP)
	$(call leg_env,$(RABBITMQ)) $(PY) -m tests.benchmarks --quick $(if $(RESULTS_SUFFIX),--own-broker) \
	    --json bench-results/quick$(RESULTS_SUFFIX).json

chaos: $(STAMP)
	$(call leg_env,$(RABBITMQ)) $(PY) -m tests.chaos --json bench-results/chaos$(RESULTS_SUFFIX).json

# The long kill and soak runs, whose short forms are in make test: the chaos run at full
# size (100,000 messages, 10 consumer kills, 2 broker restarts, 20 connection cuts), the
# inbox crash test with 10,000 messages on App and on AsyncApp, and the Spark kill tests
# (driver, executor and cluster kills, of the queue and the stream source) with fresh
# seeds (printed: rerun one with ACKKIT_SPARK_KILL_SEED / ACKKIT_INBOX_CRASH_SEED).
# 12m54s on 2 cores (December 2026: chaos 135 s, inbox 80 s + 199 s, Spark kills 158 s,
# stream kills 185 s); figures in bench-results/soak*.json and the test logs. When to run it: docs/development.md.
SOAK_SPARK := tests/spark/test_spark_crash.py tests/spark/test_spark_cluster.py
# the stream source's kills, full form: super streams need 3.11+, so on 4.3 whatever RABBITMQ
SOAK_STREAMS := tests/spark/test_spark_streams_kill.py tests/spark/test_spark_cluster_streams.py
soak: $(STAMP)
	@status=0; \
	$(call leg_env,$(RABBITMQ)) $(PY) -m tests.chaos --seed $$(date +%s) \
	    --json bench-results/soak-chaos$(RESULTS_SUFFIX).json || status=1; \
	for kind in sync async; do \
	    ACKKIT_INBOX_CRASH_N=10000 ACKKIT_INBOX_CRASH_KIND=$$kind ACKKIT_INBOX_CRASH_SEED=$$(date +%s) \
	        $(call leg_env,$(RABBITMQ)) $(PYTEST) tests/inbox/test_inbox_crash.py -p no:cacheprovider -s \
	        || status=1; \
	done; \
	ACKKIT_FUZZ=1 $(call leg_env,$(RABBITMQ)) $(PYTEST) $(SOAK_SPARK) -p no:cacheprovider -s || status=1; \
	ACKKIT_FUZZ=1 $(call leg_env,4.3) $(PYTEST) $(SOAK_STREAMS) -p no:cacheprovider -s || status=1; \
	exit $$status

clean:
	rm -rf .venv build dist *.egg-info testkit/build testkit/*.egg-info .pytest_cache .mypy_cache .ruff_cache
