// compactd's dashboard: savings, shadow mode, conversations and the inspector.
// Plain browser JavaScript, no build step. Every value from the server is put into the page as
// text (textContent), never as markup. The key lives in sessionStorage and goes out only as an
// Authorization header to this origin's /compactd/v1/ API.
"use strict";

(() => {
  const KEY = "compactd.key";
  const API = "/compactd/v1/";
  const RANGES = [["0d", "Today"], ["7d", "Last 7 days"], ["30d", "Last 30 days"], ["90d", "Last 90 days"]];
  const GROUPS = [["policy", "Policy"], ["model", "Model"], ["policy-model", "Policy / model"], ["tenant", "Tenant"], ["api", "API"]];
  const MARKER = /\[compactd:ref=([0-9a-f]{6,32})[^\]\n]*\]?/g;
  const LONG = 4000;
  let me = null;
  let charts = [];

  // ---- formatting (fixed locale: the figures must read the same everywhere) ----
  const nf = new Intl.NumberFormat("en-US");
  const fmt = {
    int: (n) => nf.format(Math.round(n || 0)),
    pct: (x) => `${((x || 0) * 100).toFixed(1)} %`,
    usd: (x) => {
      const v = x || 0;
      const digits = Math.abs(v) >= 1 || v === 0 ? 2 : 4;
      return `${v < 0 ? "−" : ""}$${Math.abs(v).toFixed(digits)}`;
    },
    bytes: (n) => (n >= 1048576 ? `${(n / 1048576).toFixed(1)} MiB` : n >= 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${n} B`),
    time: (epoch) => (epoch ? new Date(epoch * 1000).toISOString().slice(0, 16).replace("T", " ") + " UTC" : "–"),
  };

  // "1 policy", "2 policies", "1,024 requests": the count formatted, the noun agreeing with it.
  function plural(n, one, many) {
    return `${fmt.int(n)} ${Math.round(n || 0) === 1 ? one : many || `${one}s`}`;
  }

  // Tick steps a count axis may use: whole numbers only (never 0.2, shown rounded as "0, 0, 1").
  const WHOLE = [1, 2, 5];
  const INCRS = [];
  for (let mag = 1; mag <= 1e12; mag *= 10) for (const m of WHOLE) INCRS.push(m * mag);

  // ---- DOM helpers ----
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const $ = (id) => document.getElementById(id);

  function status(text, isError) {
    const node = $("status");
    node.textContent = text || "";
    node.classList.toggle("error", Boolean(isError));
  }

  // ---- the API ----
  class ApiError extends Error {
    constructor(code, message) {
      super(message);
      this.code = code;
    }
  }

  async function api(path) {
    const key = sessionStorage.getItem(KEY);
    const response = await fetch(API + path, {
      headers: { Authorization: `Bearer ${key}`, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
    });
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    if (!response.ok) {
      const message = (body && body.error && body.error.message) || `HTTP ${response.status}`;
      throw new ApiError(response.status, message);
    }
    return body;
  }

  // ---- sign-in ----
  async function signIn(key) {
    sessionStorage.setItem(KEY, key);
    try {
      me = await api("me");
    } catch (err) {
      sessionStorage.removeItem(KEY);
      me = null;
      throw err;
    }
  }

  function signOut(message) {
    sessionStorage.removeItem(KEY);
    me = null;
    showSignIn(message);
  }

  function showSignIn(message) {
    clearView();
    $("nav").hidden = true;
    $("who").hidden = true;
    $("signin").hidden = false;
    status(message || "", Boolean(message));
    $("key").value = "";
    $("key").focus();
  }

  function showSignedIn() {
    $("signin").hidden = true;
    $("nav").hidden = false;
    $("who").hidden = false;
    $("who-text").textContent = me.admin ? "Admin: every tenant" : `Key ${me.key_id} (tenant ${me.tenant})`;
  }

  // ---- routing: #/savings?since=7d&by=policy, #/shadow, #/conversations, #/conversations/<id> ----
  function parseHash() {
    const raw = location.hash.replace(/^#\/?/, "");
    const [path, query] = raw.split("?");
    const params = new URLSearchParams(query || "");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    return { view: parts[0] || "savings", id: parts.slice(1).join("/"), params };
  }

  function clearView() {
    for (const chart of charts) chart.destroy();
    charts = [];
    $("view").replaceChildren();
  }

  async function route() {
    if (!sessionStorage.getItem(KEY)) {
      showSignIn();
      return;
    }
    if (!me) {
      try {
        me = await api("me");
      } catch (err) {
        signOut(err.code === 401 ? "That key was not accepted." : err.message);
        return;
      }
    }
    showSignedIn();
    const { view, id, params } = parseHash();
    for (const link of document.querySelectorAll("#nav a")) {
      const current = link.dataset.view === (view === "conversations" && id ? "conversations" : view);
      if (current) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    clearView();
    status("Loading…");
    try {
      if (view === "shadow") await renderShadow(params);
      else if (view === "conversations" && id) await renderInspector(id, params);
      else if (view === "conversations") await renderConversations(params);
      else await renderSavings(params);
      status("");
    } catch (err) {
      if (err.code === 401) signOut("Signed out: the key is no longer accepted.");
      else status(err.message, true);
    }
  }

  function setQuery(view, params) {
    location.hash = `#/${view}?${new URLSearchParams(params).toString()}`;
  }

  function rangeControls(view, since, by, withGroup) {
    const range = el("select", { id: "range", onchange: (e) => setQuery(view, { since: e.target.value, by }) },
      RANGES.map(([value, label]) => el("option", { value, selected: value === since }, label)));
    const controls = [el("label", {}, "Time range", range)];
    if (withGroup) {
      const groups = GROUPS.filter(([value]) => me.admin || value !== "tenant");
      const group = el("select", { id: "by", onchange: (e) => setQuery(view, { since, by: e.target.value }) },
        groups.map(([value, label]) => el("option", { value, selected: value === by }, label)));
      controls.push(el("label", {}, "Group by", group));
    }
    return el("form", { class: "controls", onsubmit: (e) => e.preventDefault() }, controls);
  }

  // ---- savings ----
  function tile(id, label, value, sub) {
    return el("div", { class: "tile", id }, el("dt", {}, label), el("dd", {}, value, sub ? el("span", { class: "sub" }, sub) : null));
  }

  function dayStamps(days) {
    return days.map((d) => Date.parse(`${d}T00:00:00Z`) / 1000);
  }

  function lineChart(target, title, days, series, formatter) {
    // One day is one bar per series, centred between empty neighbours: a line needs two
    // points, and uPlot stretches a lone point's fill across the plot (a ramp not in the data).
    const single = days.length === 1;
    const stamps = dayStamps(days);
    const data = single
      ? [[stamps[0] - 86400, stamps[0], stamps[0] + 86400], ...series.map((s) => [null, s.values[0], null])]
      : [stamps, ...series.map((s) => s.values)];
    const latest = single ? 1 : days.length - 1;
    const options = {
      title: undefined,
      width: Math.max(320, target.clientWidth || 900),
      height: 260,
      scales: {
        x: { time: true },
        // Counts start at zero, and an axis of zeros still reads 0 and 1, not 0, 0.2, ...
        y: { range: (u, min, max) => [0, Math.max(1, max || 0)] },
      },
      axes: [
        { stroke: getComputedStyle(document.body).color, incrs: single ? [86400] : undefined },
        { stroke: getComputedStyle(document.body).color, size: 70, incrs: INCRS, values: (u, ticks) => {
          const labels = ticks.map((v) => formatter(v));
          u.root.dataset.yTicks = labels.join(" ");  // the axis is canvas: its labels, readable
          return labels;
        } },
      ],
      series: [
        { label: "Day", value: (u, v) => (v == null ? "–" : new Date(v * 1000).toISOString().slice(0, 10)) },
        ...series.map((s) => ({
          label: s.label,
          stroke: s.color,
          width: 2,
          points: { show: true, size: 6 },
          value: (u, v) => (v == null ? "–" : formatter(v)),
          paths: s.bars || single ? uPlot.paths.bars({ size: [0.5, 40] }) : undefined,
          fill: s.bars || single ? s.color : s.fill,
        })),
      ],
      legend: { live: true },
      cursor: { focus: { prox: 30 } },
      // The legend shows the latest day's values until the pointer moves over the chart.
      hooks: {
        ready: [(u) => u.setLegend({ idx: latest }, false)],
        setLegend: [(u) => { if (u.legend.idx == null) u.setLegend({ idx: latest }, false); }],
      },
    };
    const chart = new uPlot(options, data, target);
    chart.root.setAttribute("aria-label", `${title}: ${series.map((s) => s.label).join(", ")}, per day (the table below has the figures)`);
    chart.root.setAttribute("role", "img");
    chart.root.dataset.shape = single ? "bars" : "lines";
    charts.push(chart);
    return chart;
  }

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  async function renderSavings(params) {
    const since = params.get("since") || "7d";
    let by = params.get("by") || "policy";
    if (by === "tenant" && !me.admin) by = "policy";
    const data = await api(`savings?since=${encodeURIComponent(since)}&by=${encodeURIComponent(by)}`);
    const t = data.total;
    const view = $("view");
    view.append(
      el("h1", {}, "Savings"),
      el("p", { class: "note" }, me.admin ? "Every tenant." : "Your key's requests only.",
        ` Since ${data.since} (UTC days). Money is priced from the model table, net of prompt caching (cache rules: ${(t.cache_rules || []).join(", ") || "none"}): ${data.assumptions || ""}.`),
      rangeControls("savings", since, by, true),
      el("dl", { class: "tiles", id: "tiles" },
        tile("tile-without", "Tokens without compactd", fmt.int(t.tokens_without)),
        tile("tile-sent", "Tokens sent", fmt.int(t.tokens_sent), `${fmt.pct(t.saved_share)} removed`),
        tile("tile-events", "Compaction events", fmt.int(t.compactions), plural(t.requests, "request")),
        tile("tile-cache", "Cache-hit share", fmt.pct(t.cache_hit_share), `${fmt.int(t.cached_tokens)} of ${fmt.int(t.prompt_tokens)} prompt tokens`),
        tile("tile-saved", "Saved (net of cache)", fmt.usd(t.saved_usd), `gross ${fmt.usd(t.gross_saved_usd)}, cache loss ${fmt.usd(t.cache_loss_usd)}`),
        tile("tile-failopens", "Fail-opens", fmt.int(t.fail_opens), reasonsText(t.fail_open_reasons))),
    );
    const tokensBox = el("div", { class: "chart", id: "chart-tokens" });
    const eventsBox = el("div", { class: "chart", id: "chart-events" });
    const tableBox = el("div");
    const label = GROUPS.find(([v]) => v === by)[1];
    const groupName = by === "api" ? label : label.toLowerCase();
    const which = el("select", { id: "series" },
      el("option", { value: "total" }, `All ${by === "policy" ? "policies" : by === "api" ? "APIs" : groupName + "s"} together`),
      data.rows.map((r) => el("option", { value: r.key }, `${groupName} ${r.key}`)));
    view.append(
      el("div", { class: "controls" }, el("label", {}, "Charts and daily table show", which)),
      el("figure", {}, el("figcaption", {}, "Prompt tokens per day: without compactd and sent"), tokensBox),
      el("figure", {}, el("figcaption", {}, "Compaction events and fail-opens per day"), eventsBox),
      el("details", { id: "daily" }, el("summary", {}, "Daily figures as a table"), tableBox),
    );
    const draw = () => {
      for (const chart of charts) chart.destroy();
      charts = [];
      tokensBox.replaceChildren();
      eventsBox.replaceChildren();
      const s = data.series[which.value];
      lineChart(tokensBox, "Prompt tokens per day", data.days, [
        { label: "Without compactd", values: s.tokens_without, color: cssVar("--without") },
        { label: "Sent", values: s.tokens_sent, color: cssVar("--sent"), fill: "rgba(11, 92, 213, 0.08)" },
      ], fmt.int);
      lineChart(eventsBox, "Compaction events and fail-opens per day", data.days, [
        { label: "Compaction events", values: s.compactions, color: cssVar("--sent"), bars: true },
        { label: "Fail-opens", values: s.fail_opens, color: cssVar("--bad") },
      ], fmt.int);
      tableBox.replaceChildren(dailyTable(data.days, s, which.value === "total" ? "All groups added up" : `${groupName} ${which.value}`));
    };
    which.addEventListener("change", draw);
    draw();
    view.append(el("h2", {}, `By ${groupName}`), groupTable(data, by));
  }

  function reasonsText(reasons) {
    const entries = Object.entries(reasons || {});
    return entries.length ? entries.map(([r, n]) => `${r}: ${fmt.int(n)}`).join(", ") : "none";
  }

  function dailyTable(days, s, what) {
    return el("div", { class: "scroll" }, el("table", { id: "daily-table" },
      el("caption", {}, `${what}, one row per UTC day`),
      el("thead", {}, el("tr", {}, ["Day", "Requests", "Events", "Tokens without", "Tokens sent", "Cache-hit share", "Saved (net)", "Fail-opens"]
        .map((h, i) => el("th", { scope: "col", class: i ? "num" : null }, h)))),
      el("tbody", {}, days.map((day, i) => el("tr", {},
        el("th", { scope: "row" }, day),
        el("td", { class: "num" }, fmt.int(s.requests[i])),
        el("td", { class: "num" }, fmt.int(s.compactions[i])),
        el("td", { class: "num" }, fmt.int(s.tokens_without[i])),
        el("td", { class: "num" }, fmt.int(s.tokens_sent[i])),
        el("td", { class: "num" }, fmt.pct(s.cache_hit_share[i])),
        el("td", { class: "num" }, fmt.usd(s.saved_usd[i])),
        el("td", { class: "num" }, fmt.int(s.fail_opens[i])))))));
  }

  function groupTable(data, by) {
    const heads = ["Requests", "Events", "Tokens without", "Tokens sent", "Removed", "Cache-hit share", "Cost", "Saved (net)", "Cache loss", "Shadow would save", "Fail-opens"];
    const rows = [...data.rows, { ...data.total, key: "Total" }];
    return el("div", { class: "scroll" }, el("table", { id: "groups" },
      el("caption", {}, data.rows.length ? plural(data.rows.length, by === "api" ? "API" : by, by === "policy" ? "policies" : by === "api" ? "APIs" : null) : "No requests in this range"),
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, GROUPS.find(([v]) => v === by)[1]), heads.map((h) => el("th", { scope: "col", class: "num" }, h)))),
      el("tbody", {}, rows.map((r) => el("tr", { "data-key": r.key },
        el("th", { scope: "row" }, r.key),
        el("td", { class: "num" }, fmt.int(r.requests)),
        el("td", { class: "num" }, fmt.int(r.compactions)),
        el("td", { class: "num" }, fmt.int(r.tokens_without)),
        el("td", { class: "num" }, fmt.int(r.tokens_sent)),
        el("td", { class: "num" }, fmt.pct(r.saved_share)),
        el("td", { class: "num" }, fmt.pct(r.cache_hit_share)),
        el("td", { class: "num" }, fmt.usd(r.cost_usd)),
        el("td", { class: `num ${r.saved_usd < 0 ? "bad" : ""}` }, fmt.usd(r.saved_usd)),
        el("td", { class: "num" }, fmt.usd(r.cache_loss_usd)),
        el("td", { class: "num" }, fmt.usd(r.shadow_would_save_usd)),
        el("td", { class: "num", title: reasonsText(r.fail_open_reasons) }, fmt.int(r.fail_opens)))))));
  }

  // ---- shadow mode ----
  async function renderShadow(params) {
    const since = params.get("since") || "7d";
    const data = await api(`savings?since=${encodeURIComponent(since)}&by=policy`);
    const stats = Object.fromEntries(data.rows.map((r) => [r.key, r]));
    const view = $("view");
    view.append(
      el("h1", {}, "Shadow mode: what enforce would save"),
      el("p", { class: "note" }, "A policy in shadow mode does everything enforce would (replay, compaction, storing originals) but forwards the client's original bytes. These are the savings switching it to enforce would have given, priced like real savings."),
      rangeControls("shadow", since, "policy", false),
    );
    const policies = data.policies.length ? data.policies : data.rows.map((r) => ({ name: r.key, mode: "", providers: [] }));
    const heads = ["Mode", "Providers", "Requests", "Shadow requests", "Tokens sent", "Enforce would remove", "Share", "Would save (net)", "Saved now (net)"];
    view.append(el("div", { class: "scroll" }, el("table", { id: "shadow" },
      el("caption", {}, "Per policy, over the range"),
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Policy"), heads.map((h, i) => el("th", { scope: "col", class: i > 1 ? "num" : null }, h)))),
      el("tbody", {}, policies.map((p) => {
        const r = stats[p.name] || { requests: 0, shadow_requests: 0, tokens_sent: 0, shadow_tokens_would_save: 0, shadow_would_save_usd: 0, saved_usd: 0 };
        const share = r.tokens_sent ? r.shadow_tokens_would_save / r.tokens_sent : 0;
        return el("tr", { "data-policy": p.name },
          el("th", { scope: "row" }, p.name),
          el("td", {}, p.mode || "–"),
          el("td", {}, (p.providers || []).join(" + ") || "–"),
          el("td", { class: "num" }, fmt.int(r.requests)),
          el("td", { class: "num" }, fmt.int(r.shadow_requests)),
          el("td", { class: "num" }, fmt.int(r.tokens_sent)),
          el("td", { class: "num" }, fmt.int(r.shadow_tokens_would_save)),
          el("td", { class: "num" }, fmt.pct(share)),
          el("td", { class: "num good" }, fmt.usd(r.shadow_would_save_usd)),
          el("td", { class: "num" }, fmt.usd(r.saved_usd)));
      })))));
  }

  // ---- conversations ----
  async function renderConversations(params) {
    // A page at a time (limits.list_page_size): the first ten pages, most recently used first.
    const every = params.get("all") === "1";
    const base = `conversations${every ? "?all=true&" : "?"}`;
    let data = await api(base.slice(0, -1));
    const list = [...data.data];
    for (let page = 1; data.has_more && page < 10; page++) {
      data = await api(`${base}after=${encodeURIComponent(data.next)}`);
      list.push(...data.data);
    }
    const more = data.has_more ? "+" : "";
    const view = $("view");
    const query = params.get("q") || "";
    const search = el("input", { id: "q", type: "search", value: query, placeholder: "conversation, tenant, API or model", "aria-controls": "conversations" });
    const all = el("input", { id: "all", type: "checkbox", checked: every, onchange: (e) => setQuery("conversations", e.target.checked ? { all: "1" } : {}) });
    const body = el("tbody");
    const caption = el("caption");
    const cell = (value, format) => el("td", { class: "num" }, value === null || value === undefined ? "–" : format(value));
    const heads = [
      ["Conversation"], me.admin ? ["Tenant"] : null, ["API"], ["Model"], ["Requests", true], ["Tokens before", true],
      ["Tokens after", true], ["Saved", true], ["Compaction events", true], ["Size", true], ["Last used"],
    ].filter(Boolean);
    const link = (c) => (c.compacted
      ? el("a", { href: `#/conversations/${encodeURIComponent(c.conversation)}${me.admin ? `?tenant=${encodeURIComponent(c.tenant)}` : ""}`, class: "mono" }, c.conversation)
      : el("span", { class: "mono", title: "Never compacted: nothing is stored to inspect" }, c.conversation));
    const fill = () => {
      const q = search.value.trim().toLowerCase();
      const shown = list.filter((c) => !q || [c.conversation, c.tenant, c.api || "", c.model || ""].some((v) => v.toLowerCase().includes(q)));
      caption.textContent = `${fmt.int(shown.length)} of ${plural(list.length, every ? "conversation" : "compacted conversation")}${more}, most recently used first`;
      body.replaceChildren(...shown.map((c) => el("tr", { "data-conversation": c.conversation, "data-compacted": String(c.compacted) },
        el("th", { scope: "row" }, link(c)),
        me.admin ? el("td", { class: "mono" }, c.tenant) : null,
        el("td", {}, c.api || "–"),
        el("td", {}, c.model || "–"),
        cell(c.requests, fmt.int),
        cell(c.tokens_before, fmt.int),
        cell(c.tokens_after, fmt.int),
        cell(c.tokens_saved, (v) => (c.tokens_before ? `${fmt.int(v)} (${fmt.pct(v / c.tokens_before)})` : fmt.int(v))),
        el("td", { class: "num" }, c.compacted ? fmt.int(c.checkpoint_count) : "none"),
        el("td", { class: "num" }, fmt.bytes(c.size_bytes)),
        el("td", {}, fmt.time(c.updated_at)))));
    };
    search.addEventListener("input", fill);
    view.append(
      el("h1", {}, "Conversations"),
      el("p", { class: "note" }, every
        ? "Every conversation with a request in the retention period. Compacted ones keep their originals: open one to see each checkpoint beside the messages it replaced."
        : "Conversations with stored originals (one compaction event or more). Open one to see each checkpoint beside the messages it replaced."),
      el("div", { class: "search" }, el("label", { for: "q" }, "Search"), search,
        el("label", { class: "check" }, all, "Show conversations that never compacted")),
      el("div", { class: "scroll" }, el("table", { id: "conversations" }, caption,
        el("thead", {}, el("tr", {}, heads.map(([h, num]) => el("th", { scope: "col", class: num ? "num" : null }, h)))),
        body)),
    );
    fill();
  }

  // ---- the inspector ----
  function textOf(message) {
    const parts = [];
    const content = message.content;
    if (typeof content === "string") parts.push(content);
    else if (Array.isArray(content)) {
      for (const part of content) {
        if (part && typeof part.text === "string") parts.push(part.text);
        else if (part && part.type) parts.push(`[${part.type}]`);
      }
    }
    for (const call of message.tool_calls || []) {
      const fn = (call && call.function) || {};
      parts.push(`→ ${fn.name || "tool"}(${fn.arguments || ""})`);
    }
    if (typeof message.reasoning_content === "string") parts.push(`[reasoning] ${message.reasoning_content}`);
    return parts.join("\n");
  }

  function withMarkers(text, linkFor) {
    const nodes = [];
    let last = 0;
    for (const match of text.matchAll(MARKER)) {
      if (match.index > last) nodes.push(text.slice(last, match.index));
      const target = linkFor(match[1]);
      nodes.push(target
        ? el("a", { class: "marker", href: `#${target}`, "data-ref": match[1], onclick: (e) => { e.preventDefault(); reveal(target); } }, match[0])
        : el("span", { class: "marker missing", title: "No stored original for this reference" }, match[0]));
      last = match.index + match[0].length;
    }
    nodes.push(text.slice(last));
    return nodes;
  }

  function reveal(id) {
    const node = $(id);
    if (!node) return;
    for (let up = node; up; up = up.parentElement) if (up.tagName === "DETAILS") up.open = true;
    for (const inner of node.querySelectorAll("details")) inner.open = true;
    for (const old of document.querySelectorAll(".target")) old.classList.remove("target");
    node.classList.add("target");
    node.scrollIntoView({ block: "start" });
    node.focus({ preventScroll: true });
  }

  function messageBlock(message, tokens, label, attrs, linkFor) {
    const text = textOf(message);
    const shown = text.length > LONG ? text.slice(0, LONG) : text;
    const pre = el("pre", {}, linkFor ? withMarkers(shown, linkFor) : shown);
    const more = text.length > LONG
      ? el("button", { type: "button", onclick: (e) => { pre.replaceChildren(...(linkFor ? withMarkers(text, linkFor) : [text])); e.target.remove(); } }, `Show all ${fmt.int(text.length)} characters`)
      : null;
    const extra = [message.name ? `name ${message.name}` : null, message.tool_call_id ? `for call ${message.tool_call_id}` : null].filter(Boolean).join(", ");
    return el("article", { class: "msg", tabindex: "-1", ...attrs },
      el("header", {}, el("span", { class: "role" }, message.role || "?"), el("span", {}, label), el("span", {}, `${fmt.int(tokens)} tokens`), extra ? el("span", {}, extra) : null),
      pre, more);
  }

  async function renderInspector(id, params) {
    // Two tenants can share a conversation id (a digest of how it starts): the admin's link names whose.
    const tenant = params.get("tenant");
    const data = await api(`conversations/${encodeURIComponent(id)}/inspect${tenant ? `?tenant=${encodeURIComponent(tenant)}` : ""}`);
    const view = $("view");
    const checkpoints = data.checkpoints;
    view.append(
      el("p", {}, el("a", { href: "#/conversations" }, "← All conversations")),
      el("h1", {}, "Conversation ", el("code", { id: "conversation-id" }, data.conversation)),
      el("dl", { class: "meta" }, [
        ["Tenant", data.tenant], ["Compaction events", fmt.int(data.checkpoint_count)], ["Originals kept", fmt.int(data.original_count)],
        ["Stored size", fmt.bytes(data.size_bytes)], ["First stored", fmt.time(data.created_at)], ["Last used", fmt.time(data.updated_at)],
        ["Expires", fmt.time(data.expires_at)], ["Tokens counted with", data.encoding],
      ].map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, v)))),
    );
    if (!checkpoints.length) {
      view.append(el("p", {}, "No checkpoints are stored for this conversation."));
      return;
    }
    const picker = el("div", { class: "checkpoints", role: "group", "aria-label": "Checkpoints" });
    const holder = el("div");
    const download = el("button", { type: "button", id: "download", class: "primary" }, "Download restored originals (JSON)");
    view.append(el("h2", {}, "Checkpoints"), picker, el("div", { class: "actions" }, download), holder);
    let current = checkpoints[checkpoints.length - 1];
    const show = (cp) => {
      current = cp;
      for (const b of picker.children) b.setAttribute("aria-pressed", String(b.dataset.number === String(cp.number)));
      holder.replaceChildren(checkpointTable(data, cp));
    };
    for (const cp of checkpoints) {
      picker.append(el("button", { type: "button", "data-number": cp.number, onclick: () => show(cp) },
        `#${cp.number} · messages 0–${cp.covered_through} · ${cp.providers.join("+") || "none"} · ${fmt.int(cp.tokens_before)} → ${fmt.int(cp.tokens_after)} tokens`));
    }
    download.addEventListener("click", () => downloadRestored(data, current));
    show(current);
  }

  function restoredMessages(data, cp) {
    const out = [];
    for (const row of cp.rows) {
      if (!row.refs.length) out.push(row.message);
      else for (const group of row.stands_for) for (const digest of group.digests) out.push(data.originals[digest].message);
    }
    return out;
  }

  function downloadRestored(data, cp) {
    // A Responses or Messages conversation goes out as the client's own items (`input` or
    // `messages`, restored by the server), a chat one as its messages.
    const restored = cp.restored || { messages: restoredMessages(data, cp) };
    const body = {
      conversation: data.conversation,
      tenant: data.tenant,
      ...(cp.restored ? { api: data.api } : {}),
      checkpoint: cp.number,
      covered_through: cp.covered_through,
      ...restored,
      missing_ids: cp.missing,
    };
    const items = body.input || body.messages;
    const blob = new Blob([JSON.stringify(body, null, 2)], { type: "application/json" });
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: `compactd-${data.conversation}-checkpoint-${cp.number}.json` });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
    status(`Downloaded ${plural(items.length, body.input ? "original item" : "original message")} of checkpoint #${cp.number}.`);
  }

  function checkpointTable(data, cp) {
    // A marker links to the originals of its ref, in whichever row of this checkpoint they are.
    const anchors = new Map();
    for (const row of cp.rows) for (const group of row.stands_for) anchors.set(group.ref, `orig-${cp.number}-${group.ref}`);
    const linkFor = (ref) => anchors.get(ref) || null;
    const replaced = cp.rows.filter((r) => r.refs.length).length;
    return el("div", { class: "scroll" }, el("table", { class: "inspect", id: "inspect" },
      el("caption", {}, `Checkpoint #${cp.number}: original messages 0–${cp.covered_through} as the client sent them, beside the ${plural(cp.rows.length, "message")} forwarded in their place (${fmt.int(replaced)} rewritten). Every later turn replays these forwarded bytes.`),
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Original messages"), el("th", { scope: "col" }, "Forwarded"))),
      el("tbody", {}, cp.rows.map((row) => el("tr", {},
        el("td", {}, row.refs.length ? null : el("p", { class: "kept" }, `Message ${row.first}: forwarded unchanged`),
          row.stands_for.map((group) => el("section", { id: `orig-${cp.number}-${group.ref}`, tabindex: "-1", "data-ref": group.ref },
            el("details", { open: group.digests.length <= 3 },
              el("summary", {}, `${plural(group.digests.length, "original message")} behind ref ${group.ref}`),
              group.digests.map((digest, j) => messageBlock(data.originals[digest].message, data.originals[digest].tokens,
                `original ${row.first + offsetIn(row, group) + j}`, { "data-digest": digest }, null))))),
          row.refs.filter((ref) => !row.stands_for.some((g) => g.ref === ref)).map((ref) => el("p", { class: "missing" }, `ref ${ref}: original not stored`))),
        el("td", {}, messageBlock(row.message, row.tokens, row.refs.length ? `stands for ${row.first}–${row.last}` : `message ${row.first}`, { "data-forwarded": "" }, linkFor))))),
    ));
  }

  function offsetIn(row, group) {
    let offset = 0;
    for (const g of row.stands_for) {
      if (g === group) return offset;
      offset += g.digests.length;
    }
    return offset;
  }

  // ---- start ----
  function start() {
    $("signin-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      const key = $("key").value.trim();
      if (!key) return;
      status("Signing in…");
      try {
        await signIn(key);
        $("key").value = "";
        if (!location.hash || location.hash === "#") location.hash = "#/savings";
        else await route();
        $("main").focus();
      } catch (err) {
        showSignIn(err.code === 401 ? "That key was not accepted." : err.message);
      }
    });
    $("signout").addEventListener("click", () => signOut("Signed out."));
    window.addEventListener("hashchange", route);
    window.addEventListener("resize", () => {
      for (const chart of charts) chart.setSize({ width: Math.max(320, chart.root.parentElement.clientWidth), height: 260 });
    });
    route();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
