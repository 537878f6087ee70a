"""The dashboard in a real browser: Debian's chromium, headless, driven by playwright.

Sign in, read the savings the API reports off the page and the chart, open a conversation, follow
a marker to the original behind it, download the restored originals, and check that a client key
sees none of another tenant's conversations. Without chromium (or playwright) the test skips
outside CI and fails under CI=true. COMPACTD_TEST_SCREENSHOTS=<dir> keeps the screenshots (the
docs' are made this way).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.app.application import create_app
from proxy.config import load_settings
from proxy.wire.tenant import tenant_id
from tests import dashboard_data as dd
from tests.app.test_dashboard import restored
from tests.upstream import serve

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# The flags that work on this kind of machine (no sandbox as root, no network but loopback).
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the browser test cannot run under CI: {why}")
    pytest.skip(why)


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Any]:
    """A fresh headless chromium profile, and its first page."""
    if not Path(CHROMIUM).exists():
        _unavailable("chromium is not installed (apt-get install chromium)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[test]')")
    async with async_playwright() as p:
        context = await p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 900},
            accept_downloads=True,
        )
        try:
            yield context
        finally:
            await context.close()


@pytest.fixture
async def dashboard(tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, int]]]:
    """compactd on a real socket with four weeks of history and today's traffic."""
    data = tmp_path / "data"
    data.mkdir()
    tenants = [tenant_id(dd.SECRET.encode(), k) for k in (dd.ALPHA, dd.BETA)]
    await dd.seed_history(data / "compactd.db", tenants, days=29)
    overrides = {**dd.config(data), "upstream": {"url": "http://upstream.test/v1"}}
    settings = load_settings(None, env={}, overrides=overrides)
    upstream = dd.upstream()
    app = create_app(
        settings, transport=httpx.MockTransport(upstream.handle), registry=dd.registry()
    )
    async with serve(app, lifespan="on") as url, httpx.AsyncClient(base_url=url) as client:
        made = await dd.drive(client)
        for _ in range(200):  # usage is recorded off the request path
            body = await _api(url, "savings?since=0d", dd.ADMIN)
            if body["total"]["requests"] >= sum(made.values()):
                break
        yield url, made


async def _api(url: str, path: str, key: str) -> Any:
    async with httpx.AsyncClient(base_url=url) as client:
        response = await client.get(
            f"/compactd/v1/{path}", headers={"authorization": f"Bearer {key}"}
        )
        response.raise_for_status()
        return response.json()


def n(value: float) -> str:
    return f"{round(value):,}"


def pct(value: float) -> str:
    return f"{value * 100:.1f} %"


async def _shot(page: Any, tmp_path: Path, name: str, full: bool = True) -> None:
    path = tmp_path / f"{name}.png"
    await page.screenshot(path=str(path), full_page=full)
    keep = os.environ.get("COMPACTD_TEST_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)


async def _watched_page(browser: Any) -> tuple[Any, list[str]]:
    """The browser's page, and the console errors and page errors it reports as they come."""
    page = browser.pages[0] if browser.pages else await browser.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    return page, problems


async def _sign_in(page: Any, url: str, key: str) -> None:
    await page.goto(f"{url}/compactd/ui/")
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    await page.locator("#tiles").wait_for()


async def test_an_operator_reads_savings_inspects_a_conversation_and_tenants_stay_apart(
    browser: Any, dashboard: tuple[str, dict[str, int]], tmp_path: Path
) -> None:
    from playwright.async_api import expect

    url, made = dashboard
    page, problems = await _watched_page(browser)

    # --- sign in with the admin key: nothing of it in the URL, the tiles say what the API says
    await _sign_in(page, url, dd.ADMIN)
    assert dd.ADMIN not in page.url
    await page.get_by_label("Time range").select_option("30d")
    await expect(page.locator("#range")).to_have_value("30d")
    api = await _api(url, "savings?since=30d&by=policy", dd.ADMIN)
    total = api["total"]
    await expect(page.locator("#tile-without dd")).to_have_text(n(total["tokens_without"]))
    await expect(page.locator("#tile-sent dd")).to_contain_text(n(total["tokens_sent"]))
    await expect(page.locator("#tile-sent dd")).to_contain_text(
        f"{pct(total['saved_share'])} removed"
    )
    await expect(page.locator("#tile-events dd")).to_contain_text(n(total["compactions"]))
    await expect(page.locator("#tile-cache dd")).to_contain_text(pct(total["cache_hit_share"]))
    await expect(page.locator("#tile-saved dd")).to_contain_text(f"${total['saved_usd']:.2f}")
    await expect(page.locator("#tile-failopens dd")).to_contain_text(n(total["fail_opens"]))
    await expect(page.locator("#tile-failopens dd")).to_contain_text(f"provider: {made['lab']}")

    # --- the chart: drawn, and its legend reads the API's figures for the day under the pointer
    chart = page.locator("#chart-tokens")
    await expect(chart.locator("canvas")).to_have_count(1)
    series = api["series"]["total"]
    values = chart.locator(".u-legend .u-value")
    await expect(values).to_have_text(
        [api["days"][-1], n(series["tokens_without"][-1]), n(series["tokens_sent"][-1])]
    )
    over = chart.locator(".u-over")
    box = await over.bounding_box()
    busiest = max(range(len(api["days"])), key=lambda i: series["tokens_without"][i])
    x = box["width"] * busiest / (len(api["days"]) - 1)
    await over.hover(position={"x": x, "y": box["height"] / 2})
    await expect(values).to_have_text(
        [
            api["days"][busiest],
            n(series["tokens_without"][busiest]),
            n(series["tokens_sent"][busiest]),
        ]
    )
    await _shot(page, tmp_path, "dashboard-savings")
    await page.locator("#daily summary").click()
    today = page.locator("#daily-table tbody tr").last
    await expect(today.locator("td").nth(2)).to_have_text(n(series["tokens_without"][-1]))

    # --- shadow mode: what the search team's shadow policy would have saved
    await page.get_by_role("link", name="Shadow mode").click()
    shadow = page.locator('#shadow tr[data-policy="search-shadow"]')
    row = {r["key"]: r for r in (await _api(url, "savings?since=7d&by=policy", dd.ADMIN))["rows"]}
    await expect(shadow.locator("td").nth(0)).to_have_text("shadow")
    await expect(shadow.locator("td").nth(5)).to_have_text(
        n(row["search-shadow"]["shadow_tokens_would_save"])
    )
    await _shot(page, tmp_path, "dashboard-shadow")

    # --- conversations: the admin sees every tenant's; search narrows the list
    await page.get_by_role("link", name="Conversations").click()
    rows = page.locator("#conversations tbody tr")
    await expect(rows).to_have_count(3)
    alpha = tenant_id(dd.SECRET.encode(), dd.ALPHA)
    await page.get_by_label("Search").fill(alpha[:10])
    await expect(rows).to_have_count(1)
    await _shot(page, tmp_path, "dashboard-conversations")
    await rows.first.get_by_role("link").click()

    # --- the inspector: follow a marker to the original behind it
    conv = (await page.locator("#conversation-id").text_content()) or ""
    view = await _api(url, f"conversations/{conv}/inspect", dd.ADMIN)
    latest = view["checkpoints"][-1]
    marker = page.locator("#inspect a.marker").first
    ref = await marker.get_attribute("data-ref")
    group = next(g for r in latest["rows"] for g in r["stands_for"] if g["ref"] == ref)
    original = view["originals"][group["digests"][0]]["message"]
    target = page.locator(f"#orig-{latest['number']}-{ref}")
    await expect(page.locator("#inspect")).to_be_visible()
    await _shot(page, tmp_path, "dashboard-inspector", full=False)
    await marker.click()
    await expect(target).to_have_class("target")
    first = target.locator("article.msg pre").first
    await expect(first).to_be_visible()
    await expect(first).to_contain_text(str(original.get("content") or original["role"])[:60])
    await expect(target.locator("article.msg header").first).to_contain_text(
        f"{n(view['originals'][group['digests'][0]]['tokens'])} tokens"
    )
    await _shot(page, tmp_path, "dashboard-marker", full=False)

    # --- the download holds exactly the restored originals
    async with page.expect_download() as info:
        await page.get_by_role("button", name="Download restored originals (JSON)").click()
    download = await info.value
    saved = json.loads(Path(await download.path()).read_text())
    assert saved["conversation"] == conv
    assert saved["messages"] == restored(view, latest)
    assert len(saved["messages"]) == latest["covered_through"] + 1

    # --- sign out; a client key sees its own conversation only, never alpha's
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_label("API key")).to_be_visible()
    assert await page.evaluate("sessionStorage.length") == 0
    await _sign_in(page, url, dd.BETA)
    beta = await _api(url, "savings?since=7d", dd.BETA)
    await expect(page.locator("#tile-without dd")).to_have_text(n(beta["total"]["tokens_without"]))
    await expect(page.locator("#who-text")).to_contain_text(beta["tenant"])
    await page.get_by_role("link", name="Conversations").click()
    await expect(rows).to_have_count(1)
    await expect(rows.first).not_to_contain_text(conv)
    assert problems == [], problems  # no script error, no resource refused by the CSP
    await page.goto(f"{url}/compactd/ui/#/conversations/{conv}")
    await expect(page.locator("#status")).to_have_text("No such conversation.")
    await expect(page.locator("#inspect")).to_have_count(0)
    assert "ALPHA BUILD" not in (await page.content())
    assert all("404" in p for p in problems), problems  # the browser logs the refused fetch


# --- each page after sign-in, and the rough edges a new operator met ----------------------------

SHOTS = os.environ.get("COMPACTD_TEST_SCREENSHOTS", "")
# A count the page shows with the wrong noun: "1 policies", "1 requests", ...
SINGULAR_AS_PLURAL = re.compile(
    r"(?<![\d,.])1 (policies|requests|conversations|messages|items|APIs|models|tenants|events)\b"
)

_INK = """async (b64) => {
  const img = new Image();
  img.src = "data:image/png;base64," + b64;
  await img.decode();
  const canvas = document.createElement("canvas");
  canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
  const ctx = canvas.getContext("2d");
  ctx.drawImage(img, 0, 0);
  const px = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  const colours = new Set();
  let ink = 0;
  for (let i = 0; i < px.length; i += 4 * 7) {
    colours.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
    if (px[i] + px[i + 1] + px[i + 2] < 600) ink += 1;
  }
  return { colours: colours.size, ink: ink / (px.length / (4 * 7)) };
}"""


async def _checked_shot(page: Any, tmp_path: Path, name: str, problems: list[str]) -> None:
    """A full-page screenshot that is not blank (several colours, some ink), taken with no
    console error so far; kept under $COMPACTD_TEST_SCREENSHOTS when set."""
    import base64

    await page.wait_for_load_state("networkidle")
    path = tmp_path / f"{name}.png"
    png = await page.screenshot(path=str(path), full_page=True)
    seen = await page.evaluate(_INK, base64.b64encode(png).decode())
    assert seen["colours"] >= 8, (name, seen)
    assert seen["ink"] > 0.002, (name, seen)
    assert problems == [], (name, problems)
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(SHOTS) / path.name)


async def _no_plural_slips(page: Any) -> None:
    text = await page.locator("body").inner_text()
    assert SINGULAR_AS_PLURAL.search(text) is None, SINGULAR_AS_PLURAL.search(text)


async def test_every_page_after_sign_in_is_drawn_cleanly_without_the_old_rough_edges(
    browser: Any, dashboard: tuple[str, dict[str, int]], tmp_path: Path
) -> None:
    from playwright.async_api import expect

    url, _ = dashboard
    page, problems = await _watched_page(browser)

    # Before sign-in: the sign-in form only; no nav, no "Sign out" (CSS display: flex used to
    # override the hidden attribute).
    await page.goto(f"{url}/compactd/ui/")
    await expect(page.get_by_label("API key")).to_be_visible()
    await expect(page.locator("#nav")).to_be_hidden()
    await expect(page.get_by_role("button", name="Sign out")).to_be_hidden()
    assert await page.locator("#nav").evaluate("n => getComputedStyle(n).display") == "none"
    await _checked_shot(page, tmp_path, "signin", problems)

    # Savings over 30 days: lines; the events axis is whole numbers, each once.
    await _sign_in(page, url, dd.ADMIN)
    await expect(page.locator("#nav")).to_be_visible()
    await page.get_by_label("Time range").select_option("30d")
    await expect(page.locator("#range")).to_have_value("30d")
    events = page.locator("#chart-events .uplot")
    await expect(events).to_have_attribute("data-shape", "lines")
    for chart in ("#chart-events .uplot", "#chart-tokens .uplot"):
        ticks = (await page.locator(chart).get_attribute("data-y-ticks") or "").split()
        assert ticks, chart
        values = [int(t.replace(",", "")) for t in ticks]
        assert values == sorted(set(values)), (chart, ticks)  # never "1 1 1 0"
    await _no_plural_slips(page)
    await _checked_shot(page, tmp_path, "savings-30d", problems)

    # Today only: one day of data is one bar per series, not a ramp across the plot.
    await page.get_by_label("Time range").select_option("0d")
    await expect(page.locator("#range")).to_have_value("0d")
    await expect(events).to_have_attribute("data-shape", "bars")
    await expect(page.locator("#chart-tokens .uplot")).to_have_attribute("data-shape", "bars")
    ticks = (await events.get_attribute("data-y-ticks") or "").split()
    assert len(set(ticks)) == len(ticks), ticks
    await page.get_by_label("Group by").select_option("api")
    await expect(page.locator("#groups caption")).to_have_text(re.compile(r"^1 API$|^\d+ APIs$"))
    await _no_plural_slips(page)
    await _checked_shot(page, tmp_path, "savings-today", problems)

    await page.get_by_role("link", name="Shadow mode").click()
    await expect(page.locator("#shadow")).to_be_visible()
    await _no_plural_slips(page)
    await _checked_shot(page, tmp_path, "shadow", problems)

    await page.get_by_role("link", name="Conversations").click()
    rows = page.locator("#conversations tbody tr")
    await expect(rows).to_have_count(3)
    await expect(page.locator("#conversations caption")).to_have_text(
        "3 of 3 compacted conversations, most recently used first"
    )
    heads = await page.locator("#conversations thead th").all_inner_texts()
    for column in ("API", "Model", "Requests", "Tokens before", "Tokens after", "Saved"):
        assert column in heads, heads
    # Each row says what the API says of its conversation.
    listed = {c["conversation"]: c for c in (await _api(url, "conversations", dd.ADMIN))["data"]}
    for i in range(3):
        row = rows.nth(i)
        conv = await row.get_attribute("data-conversation")
        want = listed[conv]
        cells = await row.locator("td").all_inner_texts()
        at = {h: cells[k - 1] for k, h in enumerate(heads) if k}
        assert at["API"] == want["api"] == "chat.completions"
        assert at["Model"] == want["model"]
        assert at["Tokens before"] == n(want["tokens_before"])
        assert at["Tokens after"] == n(want["tokens_after"])
        assert at["Saved"].startswith(n(want["tokens_before"] - want["tokens_after"]))
    # A shadow policy's conversation is stored but forwarded as sent; the others saved tokens.
    assert any(c["tokens_saved"] > 0 for c in listed.values())
    await _checked_shot(page, tmp_path, "conversations", problems)
    # Conversations that never compacted: listed on request, not links (nothing to inspect).
    await page.get_by_label("Show conversations that never compacted").check()
    every = (await _api(url, "conversations?all=true", dd.ADMIN))["data"]
    never = [c for c in every if not c["compacted"]]
    assert never
    await expect(rows).to_have_count(len(every))
    plain = page.locator('#conversations tbody tr[data-compacted="false"]')
    await expect(plain).to_have_count(len(never))
    await expect(plain.first.locator("a")).to_have_count(0)
    await expect(plain.first.locator("td").nth(3)).to_have_text(n(never[0]["requests"]))
    await _no_plural_slips(page)
    await _checked_shot(page, tmp_path, "conversations-all", problems)
    await page.get_by_label("Show conversations that never compacted").uncheck()
    await expect(rows).to_have_count(3)
    await page.locator("#conversations tbody tr").first.get_by_role("link").click()
    await expect(page.locator("#inspect")).to_be_visible()
    await _no_plural_slips(page)
    await _checked_shot(page, tmp_path, "inspector", problems)

    # A client key with one conversation: the singular.
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.locator("#nav")).to_be_hidden()
    await _sign_in(page, url, dd.BETA)
    await page.get_by_role("link", name="Conversations").click()
    await expect(page.locator("#conversations caption")).to_have_text(
        "1 of 1 compacted conversation, most recently used first"
    )
    await _checked_shot(page, tmp_path, "conversations-client", problems)
