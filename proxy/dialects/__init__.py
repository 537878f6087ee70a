"""The dialects: the Responses and Messages APIs projected onto chat messages, and back.

Below the chat pipeline; above the wire, tokens and the providers.
"""
