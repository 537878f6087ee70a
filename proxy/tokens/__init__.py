"""Tokens: counting a request as the upstream bills it, the model table, budgets and windows.

Below the wire and the pipeline; above telemetry and the store (learned windows and calibration
are kept in the store).
"""
