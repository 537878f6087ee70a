"""Runtime odds and ends at the bottom of the layers: message digests and exact JSON handling.

Imports nothing of compactd's; every other layer may import it.
"""
