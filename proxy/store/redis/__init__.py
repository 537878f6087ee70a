"""The Redis store: one server or a Redis Cluster, through redis-py's asyncio client."""
