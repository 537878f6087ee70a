"""Log lines are JSON, one per request, and never carry a credential."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import uvicorn

from proxy.cli.factory import app_from_env
from proxy.telemetry.logs import (
    ADOPTED_LOGGERS,
    REQUEST_LOGGER,
    configure_logging,
    log_request,
    redact,
    request_log,
)

SECRET = "sk-proj-Zx81Qa0LmN3pR7tUvW9yB2cD4eF6gH8iJ0kL"
GEMINI_KEY = "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide state; put it back after each test."""
    names = ["", REQUEST_LOGGER, "thirdparty", *ADOPTED_LOGGERS]
    saved = {
        n: (
            list(logging.getLogger(n).handlers),
            logging.getLogger(n).level,
            logging.getLogger(n).propagate,
        )
        for n in names
    }
    factory = logging.getLogRecordFactory()
    yield
    logging.setLogRecordFactory(factory)
    for n, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(n)
        logger.handlers = handlers
        logger.setLevel(level)
        logger.propagate = propagate


@pytest.fixture
def out() -> io.StringIO:
    """Log output of configure_logging, captured."""
    buf = io.StringIO()
    configure_logging("info", stream=buf)
    return buf


def lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in buf.getvalue().splitlines()]


def test_request_log_is_one_json_line_with_the_named_fields(out: io.StringIO) -> None:
    log_request(
        request_log(
            request_id="req-1",
            tenant="0123456789ab",
            model="gpt-4o",
            policy="default",
            action="compacted",
            tokens_before=1000,
            tokens_after=600,
            upstream_status=200,
            overhead_ms=1.23456,
            ttfb_ms=250.0,
            error=None,
        )
    )
    (line,) = lines(out)
    assert line["logger"] == REQUEST_LOGGER
    assert line["level"] == "info"
    for key, want in {
        "request_id": "req-1",
        "tenant": "0123456789ab",
        "model": "gpt-4o",
        "policy": "default",
        "action": "compacted",
        "tokens_before": 1000,
        "tokens_after": 600,
        "upstream_status": 200,
        "overhead_ms": 1.235,
        "ttfb_ms": 250.0,
        "error": None,
    }.items():
        assert line[key] == want, key


def test_each_request_gets_exactly_one_line(out: io.StringIO) -> None:
    for i in range(3):
        log_request(
            request_log(request_id=f"r{i}", tenant=None, model="m", policy="p", action="bypass")
        )
    assert [line["request_id"] for line in lines(out)] == ["r0", "r1", "r2"]


def test_authorization_header_never_reaches_output(out: io.StringIO) -> None:
    log = logging.getLogger("httpx")
    log.warning("sending headers %s", {"Authorization": f"Bearer {SECRET}", "api-key": "azk123"})
    log.warning("Authorization: Bearer %s", SECRET)
    log.warning("raw %r", [(b"authorization", f"Bearer {SECRET}".encode())])
    text = out.getvalue()
    assert SECRET not in text
    assert "azk123" not in text
    assert "Bearer ***" in text


def test_query_key_in_uvicorn_access_line_is_masked(out: io.StringIO) -> None:
    access = logging.getLogger("uvicorn.access")
    access.info(
        '%s - "%s %s HTTP/%s" %d',
        "127.0.0.1:5050",
        "GET",
        f"/v1beta/models?key={GEMINI_KEY}&alt=sse",
        "1.1",
        200,
    )
    text = out.getvalue()
    assert GEMINI_KEY not in text
    assert "?key=***&alt=sse" in lines(out)[0]["msg"]  # type: ignore[operator]


def test_aiohttp_extra_fields_are_masked(out: io.StringIO) -> None:
    logging.getLogger("aiohttp.client").warning("retry", extra={"url": f"https://x/?key={SECRET}"})
    assert SECRET not in out.getvalue()


def test_exception_text_is_masked(out: io.StringIO) -> None:
    try:
        raise RuntimeError(f"upstream said: invalid api key {SECRET}")
    except RuntimeError:
        logging.getLogger("compactd").exception("upstream failed")
    text = out.getvalue()
    assert SECRET not in text
    assert "upstream failed" in text


def test_libraries_own_handlers_are_replaced_by_the_redacting_one() -> None:
    buf = io.StringIO()
    access = logging.getLogger("uvicorn.access")
    leak = io.StringIO()
    access.addHandler(logging.StreamHandler(leak))
    access.propagate = False
    configure_logging("info", stream=buf)
    access.info("GET /?key=%s", SECRET)
    assert leak.getvalue() == ""
    assert SECRET not in buf.getvalue()
    assert "key=***" in buf.getvalue()


def test_other_existing_handlers_get_the_filter() -> None:
    third = logging.getLogger("thirdparty")
    plain = io.StringIO()
    handler = logging.StreamHandler(plain)
    third.addHandler(handler)
    third.propagate = False
    configure_logging("info", stream=io.StringIO())
    third.warning("Authorization: Bearer %s", SECRET)
    assert SECRET not in plain.getvalue()
    assert "Bearer ***" in plain.getvalue()


def test_configure_logging_twice_keeps_one_handler(out: io.StringIO) -> None:
    configure_logging("info", stream=out)
    log_request(request_log(request_id="r", tenant=None, model="m", policy="p", action="error"))
    assert len(lines(out)) == 1


def test_httpx_info_chatter_is_silenced_at_info(out: io.StringIO) -> None:
    logging.getLogger("httpx").info('HTTP Request: POST https://api/v1/chat "HTTP/1.1 200 OK"')
    assert out.getvalue() == ""


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"authorization: Bearer {SECRET}", SECRET),
        ("Authorization=Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
        ("authorization: tok_live_abcdef", "tok_live_abcdef"),
        ('{"api-key": "azurekey0001"}', "azurekey0001"),
        ("x-api-key: anthropic-abc", "anthropic-abc"),
        (f"key is {SECRET} ok", SECRET),
        (f"https://generativelanguage.googleapis.com/v1?key={GEMINI_KEY}", GEMINI_KEY),
        ("https://x.blob/?sv=1&sig=AbCd%2Bsecret", "AbCd%2Bsecret"),
    ],
)
def test_redact_masks_known_credential_shapes(text: str, secret: str) -> None:
    assert secret not in redact(text)


def test_redact_leaves_ordinary_text_alone() -> None:
    text = "compacted 1200 -> 700 tokens for gpt-4o (policy default)"
    assert redact(text) == text


def test_handler_added_after_configuration_sees_masked_message(out: io.StringIO) -> None:
    late = io.StringIO()
    logging.getLogger().addHandler(logging.StreamHandler(late))
    logging.getLogger("compactd").warning("calling with ?key=%s", GEMINI_KEY)
    assert GEMINI_KEY not in late.getvalue()
    assert "?key=***" in late.getvalue()


def test_a_worker_the_factory_builds_writes_no_uvicorn_access_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`serve --workers N`: uvicorn mutes its access logger (`access_log=False`) before each
    worker loads the app; building the app must not adopt it again, or every request of every
    worker would write a second line."""
    monkeypatch.delenv("COMPACTD_CONFIG_FILE", raising=False)
    monkeypatch.setenv("COMPACTD_DATA_DIR", str(tmp_path))
    uvicorn.Config(
        "proxy.cli.factory:app_from_env", access_log=False, log_config=None
    ).configure_logging()
    app_from_env()
    assert not logging.getLogger("uvicorn.access").hasHandlers()
    assert logging.getLogger(REQUEST_LOGGER).hasHandlers()  # our own line still goes out
