"""compactd's multiprocess metric values write what prometheus_client's own would (`proxy.mpvalue`)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

from proxy.mpvalue import value_class

Op = tuple[str, str, float]

OPS = st.lists(
    st.tuples(
        st.sampled_from(["counter", "histogram"]),
        st.sampled_from(["a", "b", "c" * 300]),  # a long label grows the file past its first page
        st.floats(min_value=0, max_value=1e6, allow_nan=False),
    ),
    max_size=40,
)


def apply(ops: list[Op], value_cls: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(values, "ValueClass", value_cls)
    r = CollectorRegistry()
    counter = Counter("c", "c", ["l"], registry=r)
    hist = Histogram("h", "h", ["l"], registry=r, buckets=(0.5, 10.0, 1000.0))
    for kind, label, amount in ops:
        if kind == "counter":
            counter.labels(label).inc(amount)
        else:
            hist.labels(label).observe(amount)


def files(directory: str) -> dict[str, list[tuple[str, float, float, int]]]:
    """Each .db file's entries (key, value, timestamp, offset), by file name."""
    return {
        p.name: sorted(MmapedDict.read_all_values_from_file(str(p)))  # type: ignore[no-untyped-call]
        for p in Path(directory).glob("*.db")
    }


def scrape(directory: str) -> bytes:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return generate_latest(registry)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_the_files_and_the_scrape_are_prometheus_client_s_own(ops: list[Op]) -> None:
    with (
        tempfile.TemporaryDirectory() as ours,
        tempfile.TemporaryDirectory() as theirs,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setenv("PROMETHEUS_MULTIPROC_DIR", theirs)
        apply(ops, values.MultiProcessValue(), mp)
        apply(ops, value_class(ours), mp)
        assert files(ours) == files(theirs)
        assert scrape(ours) == scrape(theirs)


def test_each_update_is_in_the_file_when_it_returns(tmp_path: Path) -> None:
    cls = value_class(str(tmp_path))
    value = cls("counter", "c", "c_total", ("l",), ("x",), "help")
    value.inc(2.5)
    assert files(str(tmp_path))[f"counter_{os.getpid()}.db"][0][1:3] == (2.5, 0.0)
    value.set(7.0)
    assert files(str(tmp_path))[f"counter_{os.getpid()}.db"][0][1:3] == (7.0, 0.0)
    assert value.get() == 7.0


FORK = textwrap.dedent(
    """
    import os, sys
    from proxy.mpvalue import value_class
    cls = value_class(sys.argv[1])
    v = cls("counter", "c", "c_total", ("l",), ("x",), "help")
    v.inc(1)
    child = os.fork()
    if child == 0:
        v.inc(5)  # the child's own file, from zero, as prometheus_client does after a fork
        os._exit(0)
    os.waitpid(child, 0)
    v.inc(1)
    print(child)
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_writes_files_of_its_own(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORK, str(tmp_path)], capture_output=True, text=True, check=True
    )
    child = int(done.stdout)
    got = {name: vals[0][1] for name, vals in files(str(tmp_path)).items()}
    assert got[f"counter_{child}.db"] == 5.0
    assert sum(got.values()) == 7.0  # the parent's 2 in its own file


def test_compactd_s_metrics_use_it_in_multiprocess_mode(tmp_path: Path) -> None:
    code = "from prometheus_client import values; import proxy.telemetry.metrics; print(values.ValueClass)"
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert "proxy.mpvalue" in done.stdout
