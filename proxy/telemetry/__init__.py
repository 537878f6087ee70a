"""Telemetry: Prometheus metrics, JSON logs, usage accounting and the savings it adds up to.

Below the wire and the pipeline, above the store (accounting and savings read and write it).
"""
