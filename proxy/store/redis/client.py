"""The redis-py client a `store.url` names: one server, or a Redis Cluster.

    redis://[user:password@]host:6379/0        one server (rediss:// with TLS, unix:// a socket)
    redis+cluster://[user:password@]h1:7000,h2:7001[,…]   a cluster (rediss+cluster:// with TLS)

A cluster URL lists seed nodes; the client learns the rest of the topology from them, follows
MOVED and ASK redirections, and re-reads the slot map after a failover.
"""

from __future__ import annotations

from typing import Any, TypeAlias
from urllib.parse import unquote, urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

Client: TypeAlias = Redis | RedisCluster

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


def is_cluster_url(url: str) -> bool:
    """Whether `url` names a Redis Cluster."""
    return url.startswith(CLUSTER_SCHEMES)


def cluster_seeds(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """(seed (host, port) pairs, connection options) of a cluster URL; ValueError if malformed."""
    if not is_cluster_url(url):
        raise ValueError(f"not a cluster URL: {url[:60]!r}")
    tls = url.startswith("rediss+")
    rest = url.split("://", 1)[1]
    userinfo, _, hosts = rest.rpartition("@")
    hosts, _, path = hosts.partition("/")
    if path.strip("/") not in ("", "0"):
        raise ValueError("a Redis Cluster has only database 0")
    options: dict[str, Any] = {"ssl": True} if tls else {}
    if userinfo:
        user, sep, password = userinfo.partition(":")
        if sep:
            options["password"] = unquote(password)
            if user:
                options["username"] = unquote(user)
        else:
            options["password"] = unquote(user)
    seeds = []
    for item in hosts.split(","):
        parsed = urlsplit(f"//{item.strip()}")
        if not parsed.hostname:
            raise ValueError(f"cluster URL: no host in {item!r}")
        seeds.append((parsed.hostname, parsed.port or 6379))
    return seeds, options


def open_client(url: str, *, timeout: float, pool_size: int) -> Client:
    """A client for `url` with every socket operation bounded by `timeout` seconds.

    One server: a blocking pool of `pool_size` connections. A cluster: up to `pool_size`
    connections per node."""
    if not is_cluster_url(url):
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=pool_size,
            timeout=timeout,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            # One immediate retry on a broken connection only: after a Redis restart every pooled
            # connection is dead, and the first use of each would otherwise fail a request. Not on
            # timeouts: a slow Redis must fail open at the deadline, not twice as late.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        return Redis.from_pool(pool)
    seeds, options = cluster_seeds(url)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in seeds],
        max_connections=pool_size,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        # After a node dies the client re-reads the slot map and tries again, a few times, soon:
        # a failover takes the node timeout (seconds), so requests fail open meanwhile rather
        # than wait for it.
        retry=Retry(ExponentialBackoff(cap=timeout / 4, base=0.01), 2),
        **options,
    )
