# ackkit: the targets a newcomer can guess. Every target bootstraps what it
# needs (venv, packages, a RabbitMQ binary for the throwaway test node).
PY      := .venv/bin/python
PYTEST  := .venv/bin/pytest
STAMP   := .venv/.ackkit-installed

.PHONY: demo test test-docker unit check bench bench-quick chaos clean

$(STAMP): pyproject.toml .ci/bootstrap
	bash .ci/bootstrap
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo

test: $(STAMP)
	$(PYTEST) tests -m "not bench" -p no:cacheprovider
	$(MAKE) --no-print-directory test-docker

# contract + test-kit tests against RabbitMQ containers (skipped without Docker)
test-docker: $(STAMP)
	PYTEST=$(PYTEST) bash .ci/test-docker

unit: $(STAMP)
	$(PYTEST) tests/unit -q

check: $(STAMP)
	.venv/bin/ruff check ackkit examples spark tests
	.venv/bin/ruff format --check ackkit examples spark tests
	.venv/bin/mypy ackkit examples

bench: $(STAMP)
	$(PY) -m tests.benchmarks --json bench-results/latest.json

bench-quick: $(STAMP)
	$(PY) -m tests.benchmarks --quick --json bench-results/quick.json

chaos: $(STAMP)
	$(PY) -m tests.chaos --json bench-results/chaos.json

clean:
	rm -rf .venv build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
