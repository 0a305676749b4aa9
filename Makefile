# Two commands do all the set-up on a fresh machine:
#   make run    - a private RabbitMQ node (unless BANDGATE_AMQP_URL is set) and the gateway
#   make test   - lint, type-check and the whole test suite against a real RabbitMQ
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# pytest-xdist workers for the suite, each with a private RabbitMQ node of its own. Most tests
# wait on the broker's timers, so two workers cut the wall time by a third or more even on two
# cores (docs/development.md, Tests).
TEST_WORKERS ?= 2
PYTEST := $(BIN)/pytest -n $(TEST_WORKERS)

.PHONY: setup broker run test lint docs docs-serve unit bench bench-setup clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# rabbitmq-server from Debian when it is missing and no broker is configured.
broker:
	@if [ -z "$$BANDGATE_AMQP_URL$$BANDGATE_TEST_AMQP_URL" ] && [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then \
		echo "installing rabbitmq-server"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server; \
	fi

run: setup broker
	$(BIN)/bandgate dev

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The docs site (mkdocs.yml): built with warnings as errors, so a broken link fails `make test`.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --quiet

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8001

unit: setup
	$(BIN)/pytest tests/unit

test: setup broker lint docs
	$(PYTEST)

# The priority benchmark's peers (Celery, Dramatiq, psycopg), its plot, and granian for bench
# publish's floor: an optional extra.
bench-setup: setup
	$(BIN)/pip install --quiet -e '.[dev,bench]'

bench: bench-setup broker
	@command -v wrk >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk)
	$(BIN)/python -m bench all

clean:
	rm -rf $(VENV) .bandgate .pytest_cache .mypy_cache .ruff_cache

# Other RabbitMQ versions, run from Debian roots cached in .bandgate/roots/ (debootstrap as root,
# 1-3 minutes each; 4.0 from trixie, 4.3 from sid):
#   make broker-roots                    - build the roots of every version not installed here
#   make broker-roots VERSIONS=4.3       - just one; add REBUILD=1 to fetch today's sid again
#   make test-rabbitmq VERSION=4.3       - the whole suite against private nodes of that version
#                                          (= BANDGATE_TEST_RABBITMQ=4.3 .venv/bin/pytest -n 2)
.PHONY: broker-roots test-rabbitmq test-matrix

broker-roots: setup
	$(BIN)/python -m tools.broker_roots $(if $(REBUILD),--rebuild) $(VERSIONS)

test-rabbitmq: setup
	@test -n "$(VERSION)" || { echo "usage: make test-rabbitmq VERSION=3.10|4.0|4.3"; exit 2; }
	$(BIN)/python -m tools.broker_roots $(VERSION)
	BANDGATE_TEST_RABBITMQ=$(VERSION) $(PYTEST)

# The broker matrix, as CI runs it after `make test`: the integration and browser tests on 4.0
# and 4.3, but for those marked broker_independent (the HTTP edge and the CLIs, which `make
# test` ran on the installed broker). A version whose Debian root cannot be built (sid moves
# on) is reported and left out; a test that fails on a running broker fails the target.
test-matrix: setup
	@for version in 4.0 4.3; do \
		if $(BIN)/python -m tools.broker_roots $$version; then \
			echo "== the suite on RabbitMQ $$version"; \
			BANDGATE_TEST_RABBITMQ=$$version $(PYTEST) tests/integration tests/browser \
				-m "not broker_independent" || exit 1; \
		else \
			echo "== RabbitMQ $$version: its Debian root could not be built; the suite did NOT run on it"; \
		fi; \
	done
