# The two set-up commands of the README. Both work on a fresh machine with python3 (>= 3.11).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test install install-test redis lint

# Install and run the proxy on 127.0.0.1:8787 (embedded SQLite store, no Redis needed).
run: install
	$(BIN)/compactd serve

# Install with test extras, make sure a Redis answers, then lint, type-check and run every test.
test: install-test redis
	$(BIN)/ruff check proxy tests bench
	$(BIN)/ruff format --check proxy tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q .

install-test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'

# Tests use the Redis on 127.0.0.1:6379 and start private redis-servers of their own.
redis:
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || \
	  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
	    --dir /tmp --logfile /tmp/compactd-ci-redis.log
	@for i in $$(seq 50); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && exit 0; sleep 0.1; done; \
	  echo "Redis did not start on 127.0.0.1:6379" >&2; exit 1
