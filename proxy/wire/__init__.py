"""The wire: bytes to and from the upstream, headers, credentials and tenants, SSE, WebSockets.

Knows nothing of compaction: it imports only the layers below (tokens, telemetry, the store,
the providers, config and runtime).
"""
