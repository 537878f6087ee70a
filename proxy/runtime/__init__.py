"""Runtime odds and ends at the bottom of the layers: message digests, exact JSON, the allocator.

Imports nothing of compactd's; every other layer may import it.
"""
