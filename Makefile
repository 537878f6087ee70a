# The two set-up commands of the README. Both work on a fresh machine with python3 (>= 3.11).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test install install-test redis browser kubectl lint docs

# Install and run the proxy on 127.0.0.1:8787 (embedded SQLite store, no Redis needed).
run: install
	$(BIN)/compactd serve

# Install with test extras, make sure a Redis answers, then lint, type-check, check the layer
# contract (pyproject's [tool.importlinter]: each folder of proxy/ imports only the ones below
# it), build the docs (strict: a broken link or a lost generated section fails) and run every test.
test: install-test redis browser kubectl
	$(BIN)/ruff check proxy tests bench docs/_hooks
	$(BIN)/ruff format --check proxy tests bench docs/_hooks
	$(BIN)/mypy
	$(BIN)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	$(BIN)/pytest -q

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q .

install-test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'

# Tests use the Redis on 127.0.0.1:6379 and start private redis-servers of their own. Without
# redis-server they skip (and say so); under CI=true they fail instead.
redis:
	@if ! command -v redis-server >/dev/null; then \
	  echo "make: redis-server not found: the Redis tests will be skipped (apt-get install redis-server)" >&2; \
	  exit 0; fi; \
	ping='import redis,sys; redis.Redis(socket_connect_timeout=0.2).ping()'; \
	$(BIN)/python -c "$$ping" 2>/dev/null || \
	  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
	    --dir /tmp --logfile /tmp/compactd-ci-redis.log; \
	for i in $$(seq 50); do $(BIN)/python -c "$$ping" 2>/dev/null && exit 0; sleep 0.1; done; \
	  echo "make: Redis did not start on 127.0.0.1:6379" >&2; exit 1

# The dashboard's browser test drives Debian's chromium headless (playwright, from the test
# extras, never downloads a browser). Without it the test skips (and says so); under CI it fails.
browser:
	@command -v chromium >/dev/null || \
	  echo "make: chromium not found: the dashboard's browser test will be skipped (apt-get install chromium)" >&2

# Build the documentation site into site/ (make test does this too); `$(BIN)/mkdocs serve` previews it.
docs: install-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# tests/project/test_kubernetes.py renders deploy/kubernetes with kubectl kustomize (Debian's
# kubernetes-client). Without it those tests skip (and say so); under CI they fail.
kubectl:
	@command -v kubectl >/dev/null || \
	  echo "make: kubectl not found: the Kubernetes manifest tests will be skipped (apt-get install kubernetes-client)" >&2
