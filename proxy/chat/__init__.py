"""The chat pipeline: read a request once, decide (replay, count, compact, persist), send it,
retry on an overflow, relay the answer.

Below the app; above the dialects, the wire, tokens, telemetry, the store and the providers.
"""
