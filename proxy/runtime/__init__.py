"""Runtime odds and ends near the bottom of the layers: message digests, exact JSON, the options
validator, the allocator.

Imports nothing of compactd's but `proxy.errors`; every other layer may import it.
"""
