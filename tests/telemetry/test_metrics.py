"""Every metric moves when its method is called, as seen by a scrape of render()."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.telemetry.metrics import MULTIPROC_ENV, OTHER_MODEL, Metrics, multiprocess_dir


def scrape(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return scrape(metrics).get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(multiprocess="")


def test_two_instances_do_not_share_values() -> None:
    a, b = Metrics(multiprocess=""), Metrics(multiprocess="")
    a.fail_open("store")
    assert value(a, "compactd_fail_open_total", reason="store") == 1
    assert value(b, "compactd_fail_open_total", reason="store") == 0


def test_passthrough_bytes_changed_is_exported_at_zero(metrics: Metrics) -> None:
    assert scrape(metrics)[("compactd_passthrough_bytes_changed_total", frozenset())] == 0


def test_passthrough_bytes_changed_counts_bytes(metrics: Metrics) -> None:
    metrics.passthrough_bytes_changed(7)
    assert value(metrics, "compactd_passthrough_bytes_changed_total") == 7


def test_observe_request_moves_requests_and_token_counters(metrics: Metrics) -> None:
    sizes = {"tokens_before": 1000, "tokens_after": 600}
    metrics.observe_request(
        action="compacted", model="gpt-4o", policy="default", overhead_seconds=0.002, **sizes
    )
    metrics.observe_request(
        action="passthrough", model="gpt-4o", policy="default", tokens_before=50, tokens_after=50
    )
    labels = {"model": "gpt-4o", "policy": "default", "api": "chat.completions"}
    assert (
        value(
            metrics,
            "compactd_requests_total",
            action="compacted",
            model="gpt-4o",
            policy="default",
            api="chat.completions",
        )
        == 1
    )
    assert value(metrics, "compactd_tokens_before_total", **labels) == 1050
    assert value(metrics, "compactd_tokens_after_total", **labels) == 650
    assert value(metrics, "compactd_tokens_saved_total", **labels) == 400
    assert value(metrics, "compactd_overhead_seconds_count", action="compacted") == 1
    assert value(metrics, "compactd_overhead_seconds_count", action="passthrough") == 0


def test_shadow_requests_count_as_would_save_not_saved(metrics: Metrics) -> None:
    metrics.observe_request(
        action="shadow", model="m", policy="try", tokens_before=900, tokens_after=500
    )
    labels = {"model": "m", "policy": "try", "api": "chat.completions"}
    assert value(metrics, "compactd_tokens_would_save_total", **labels) == 400
    assert value(metrics, "compactd_tokens_saved_total", **labels) == 0
    assert value(metrics, "compactd_tokens_after_total", **labels) == 900


def test_observe_compaction_moves_runs_and_latency(metrics: Metrics) -> None:
    metrics.observe_compaction(policy="default", providers="trim", seconds=0.3)
    assert value(metrics, "compactd_compaction_runs_total", policy="default", providers="trim") == 1
    assert value(metrics, "compactd_compaction_seconds_count", policy="default") == 1
    assert value(metrics, "compactd_compaction_seconds_sum", policy="default") == pytest.approx(0.3)
    assert value(metrics, "compactd_compaction_seconds_bucket", policy="default", le="0.25") == 0
    assert value(metrics, "compactd_compaction_seconds_bucket", policy="default", le="0.5") == 1


def test_observe_store_moves_store_latency(metrics: Metrics) -> None:
    metrics.observe_store("find_checkpoint", 0.004)
    assert value(metrics, "compactd_store_seconds_count", op="find_checkpoint") == 1


def test_observe_upstream_counts_status_and_ttfb(metrics: Metrics) -> None:
    metrics.observe_upstream(200, 0.8)
    metrics.observe_upstream(429)
    assert value(metrics, "compactd_upstream_responses_total", status="200") == 1
    assert value(metrics, "compactd_upstream_responses_total", status="429") == 1
    assert value(metrics, "compactd_upstream_ttfb_seconds_count") == 1


def test_observe_usage_counts_billed_tokens_by_kind(metrics: Metrics) -> None:
    metrics.observe_usage(model="gpt-4o", prompt_tokens=100, cached_tokens=64, completion_tokens=9)
    assert value(
        metrics,
        "compactd_upstream_usage_tokens_total",
        kind="prompt",
        model="gpt-4o",
        api="chat.completions",
    ) == (100)
    assert value(
        metrics,
        "compactd_upstream_usage_tokens_total",
        kind="cached",
        model="gpt-4o",
        api="chat.completions",
    ) == (64)


def test_invariant_violation_counts_by_provider(metrics: Metrics) -> None:
    metrics.invariant_violation("engine")
    metrics.invariant_violation("engine")
    assert value(metrics, "compactd_invariant_violations_total", provider="engine") == 2


def test_fail_open_counts_by_reason(metrics: Metrics) -> None:
    metrics.fail_open("store")
    metrics.fail_open("count")
    assert value(metrics, "compactd_fail_open_total", reason="store") == 1
    assert value(metrics, "compactd_fail_open_total", reason="count") == 1


def test_refused_counts_by_header(metrics: Metrics) -> None:
    metrics.refused("x-compactd-bypass")
    assert value(metrics, "compactd_client_requests_refused_total", header="x-compactd-bypass") == 1


def test_model_label_set_is_capped() -> None:
    metrics = Metrics(multiprocess="", max_models=2)
    for model in ("a", "b", "c", "d", "a"):
        metrics.observe_request(
            action="passthrough", model=model, policy="p", tokens_before=1, tokens_after=1
        )
    assert (
        value(
            metrics, "compactd_tokens_before_total", model="a", policy="p", api="chat.completions"
        )
        == 2
    )
    assert (
        value(
            metrics, "compactd_tokens_before_total", model="b", policy="p", api="chat.completions"
        )
        == 1
    )
    assert (
        value(
            metrics,
            "compactd_tokens_before_total",
            model=OTHER_MODEL,
            policy="p",
            api="chat.completions",
        )
        == 2
    )


def test_multiprocess_dir_set_after_import_is_refused(tmp_path: Path) -> None:
    # This test process imported prometheus_client without the variable: values would be lost.
    with pytest.raises(RuntimeError, match=MULTIPROC_ENV):
        Metrics(multiprocess=str(tmp_path))


WRITER = textwrap.dedent(
    """
    from proxy.telemetry.metrics import Metrics
    m = Metrics()
    m.fail_open("store")
    m.observe_upstream(200, 0.5)
    m.passthrough_bytes_changed(0)
    m.observe_request(action="compacted", model="gpt-4o", policy="default",
                      tokens_before=100, tokens_after=40)
    """
)

RENDERER = textwrap.dedent(
    """
    import sys
    from proxy.telemetry.metrics import Metrics
    sys.stdout.write(Metrics().render()[0].decode())
    """
)


def run_python(code: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_multiprocess_mode_merges_two_writer_processes(tmp_path: Path) -> None:
    stale = tmp_path / "counter_99999.db"
    stale.write_bytes(b"stale")
    with multiprocess_dir(str(tmp_path)) as path:
        assert not stale.exists()
        env = {**os.environ, MULTIPROC_ENV: path}
        run_python(WRITER, env)
        run_python(WRITER, env)
        body = run_python(RENDERER, env)
    assert os.environ.get(MULTIPROC_ENV) != path
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    assert samples[("compactd_fail_open_total", frozenset({("reason", "store")}))] == 2
    assert samples[("compactd_upstream_responses_total", frozenset({("status", "200")}))] == 2
    assert samples[("compactd_upstream_ttfb_seconds_count", frozenset())] == 2
    labels = frozenset({("model", "gpt-4o"), ("policy", "default"), ("api", "chat.completions")})
    assert samples[("compactd_tokens_saved_total", labels)] == 120
    assert samples[("compactd_passthrough_bytes_changed_total", frozenset())] == 0


def test_multiprocess_dir_we_create_is_removed_on_exit() -> None:
    with multiprocess_dir() as path:
        assert Path(path).is_dir()
        assert os.environ[MULTIPROC_ENV] == path
    assert not Path(path).exists()
