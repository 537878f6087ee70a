# compactd: transparent OpenAI-compatible proxy. Build: docker build -t compactd .
# Run:   docker run -p 8787:8787 -v compactd-data:/data compactd
#        (or docker compose up, which adds Redis: see docker-compose.yml)

# --- build: a wheel and its dependencies, installed into /install -------------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel needs (pyproject's readme and force-included config files). The dashboard's
# files (proxy/app/ui/static: HTML, JS, CSS, the vendored uPlot) are package data inside `proxy`.
COPY pyproject.toml README.md ./
COPY config ./config
COPY proxy ./proxy
RUN pip install --prefix=/install .

# --- runtime -------------------------------------------------------------------------------
FROM python:3.11-slim
# TIKTOKEN_CACHE_DIR is a path, not a credential (hadolint flags the word TOKEN).
# hadolint ignore=DL3064
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TIKTOKEN_CACHE_DIR=/opt/compactd/tiktoken \
    COMPACTD_DATA_DIR=/data
COPY --from=build /install /usr/local
# jemalloc: `compactd serve` runs its workers on it when installed (server.allocator = "auto"),
# ~19 MB less per worker than glibc's malloc for tiktoken's vocabularies (docs/performance.md: memory per worker).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libjemalloc2 \
    && rm -rf /var/lib/apt/lists/*

# Bake the tiktoken encodings in at build time, so the container never needs the network to
# count tokens; loading them here also checks each file against tiktoken's expected sha256.
RUN python -c "from pathlib import Path; from proxy.tokens.encodings import seed_cache, load_encoding; d = seed_cache(Path('/opt/compactd/tiktoken')); [load_encoding(n, d) for n in ('cl100k_base', 'o200k_base')]" \
    && useradd --system --uid 10001 --user-group --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin compactd \
    && mkdir -p /data \
    && chown compactd:compactd /data

USER 10001:10001
WORKDIR /data
# The embedded store (SQLite) and the generated server secret live here; with Redis
# (REDIS_URL) only the secret does. Keep it on a volume so tenants stay stable across restarts.
VOLUME ["/data"]
# The proxy (/v1), its API (/compactd/v1), the dashboard (/compactd/ui/), /metrics, /healthz.
EXPOSE 8787

HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('COMPACTD_SERVER_PORT', '8787'), timeout=2)"]

CMD ["compactd", "serve", "--host", "0.0.0.0"]
