// Lightweight streams: the broker-wide figures (GET /v1/stats/streams) with charts over the
// last hour (the recent-samples ring), the list of streams (prefix filter, paged by id) and a
// form to send a test message. A stream's page: what describe tells of it,
// sending to it, and reading its persistent messages from a resume token (fan-out: nothing is
// taken, every reader sees every message).

import { enc, get, post } from "./api.js";
import { lineChart } from "./chart.js";
import { clear, put, fmtBytes, fmtNum, fmtTime, h, link, note, table } from "./ui.js";
import { refusal } from "./pages_topics.js";

const REFRESH_MS = 5000;
const PAGE = 50;
const READ_MAX = 50;

// The figures of GET /v1/stats/streams shown as cards: [field, label, format].
const TOTALS = [
  ["streams", "Streams", fmtNum],
  ["persistent_messages", "Persistent messages", fmtNum],
  ["in_memory_messages", "In-memory messages", fmtNum],
  ["in_memory_bytes", "In-memory bytes", fmtBytes],
  ["receivers", "Receivers waiting", fmtNum],
  ["log_bytes", "Log on disk", fmtBytes],
];
// Counters since the broker started.
const COUNTERS = [
  ["sent_persistent", "Sent, persistent"], ["sent_in_memory", "Sent, in memory"],
  ["received", "Taken (work queue)"], ["read", "Read by token"],
  ["duplicates", "Duplicates"], ["expired", "Expired"], ["dropped", "Dropped (ring full)"],
  ["blocked_sends_timed_out", "Blocking sends timed out"],
  ["created", "Streams created"], ["evicted", "Streams evicted"],
];
// Charts of GET /v1/metrics/recent's "stream_series": [series, title, format].
const CHARTS = [
  ["streams", "Streams", fmtNum],
  ["persistent_messages", "Persistent messages", fmtNum],
  ["sent_per_s", "Sent /s", fmtNum],
  ["taken_per_s", "Taken /s", fmtNum],
  ["read_per_s", "Read by token /s", fmtNum],
  ["receivers", "Receivers waiting", fmtNum],
];

async function settle(promise) {
  try { return { ok: true, value: await promise }; } catch (e) { return { ok: false, error: e }; }
}

function stat(label, value, id) {
  return h("div", { class: "card stat" }, h("div", { class: "label" }, label),
    h("div", { class: "value", id }, value));
}

// A table of [label, value] rows, without a heading row.
function kvTable(id, rows, num) {
  return h("table", { id }, h("tbody", {}, rows.map(([k, v]) =>
    h("tr", {}, h("td", {}, k), h("td", { class: num ? "num" : "val" }, v)))));
}

const idOf = (field) => `stream-${field.replaceAll("_", "-")}`;

export async function streamsPage(main) {
  const totals = h("div", { id: "stream-totals" });
  const counters = h("div", { class: "card", id: "stream-counters-card" });
  const charts = h("div", { id: "stream-charts" });
  const out = h("div", { id: "stream-result" });
  const list = streamList();
  main.append(h("h1", {}, "Streams"), totals, charts, out,
    h("div", { class: "row" },
      sendForm(out, "", () => Promise.all([drawTotals(), list.reload()])), counters),
    h("h2", {}, "Streams"), list.el);
  let timer = null;
  const drawTotals = async () => {
    const [st, rec] = await Promise.all([settle(get("/v1/stats/streams")),
      settle(get("/v1/metrics/recent"))]);
    if (st.ok) {
      const s = st.value;
      counters.hidden = false;
      put(totals, h("div", { class: "cards narrow" },
        TOTALS.map(([k, label, f]) => stat(label, f(s[k]), idOf(k)))));
      put(counters, h("h2", {}, "Since the broker started"), kvTable("stream-counters",
        COUNTERS.map(([k, label]) => [label, h("span", { id: idOf(k) }, fmtNum(s[k]))]), true));
    } else {
      put(totals, note("error", `The streams' figures (GET /v1/stats/streams): ` +
        refusal(st.error)));
      counters.hidden = true;
    }
    if (rec.ok) {
      const series = rec.value.stream_series || {};
      put(charts, h("div", { class: "charts" },
        CHARTS.map(([k, t, f]) => lineChart(t, series[k] || [], f))),
      h("p", { class: "muted" }, `One sample every ${rec.value.interval_s} s; figures ` +
        `refreshed every ${REFRESH_MS / 1000} s.`));
    } else {
      put(charts, note("error", `The streams' charts (GET /v1/metrics/recent): ` +
        refusal(rec.error)));
    }
  };
  const tick = async () => {
    await drawTotals();
    timer = setTimeout(tick, REFRESH_MS);
  };
  await Promise.all([tick(), list.reload()]);
  return () => clearTimeout(timer);
}

// The list of streams, by id: a prefix filter, and pages that start after the last id shown
// (the broker lists in id order; `after` is where a page starts).
function streamList() {
  const prefix = h("input", { id: "stream-prefix", placeholder: "any", autocomplete: "off" });
  const rows = h("div", { id: "stream-list" });
  const status = h("span", { class: "muted", id: "stream-page" });
  let starts = [""]; // the `after` of each page seen, to go back
  let page = 0;
  let nextAfter = null; // where the next page starts; null: this is the last one
  const load = async () => {
    const qs = new URLSearchParams({ prefix: prefix.value, after: starts[page],
      limit: String(PAGE) });
    let doc;
    try {
      doc = await get(`/v1/streams?${qs}`);
    } catch (e) {
      put(rows, note("error", `Listing streams: ${refusal(e)}`));
      return;
    }
    const items = doc.streams;
    nextAfter = doc.next_after ?? null;
    put(status, items.length ? `page ${page + 1}: ${fmtNum(items.length)} stream(s)` +
      (nextAfter === null ? " (the last page)" : "") : "no streams here");
    put(rows, table([
      { title: "Stream", cls: "val", cell: (s) => link(`#/stream/${enc(s.stream)}`, s.stream) },
      { title: "Partition", num: 1, cell: (s) => s.partition },
      { title: "Waiting", num: 1, cell: (s) => fmtNum(s.waiting) },
      { title: "Persistent", num: 1, cell: (s) => fmtNum(s.persistent) },
      { title: "In memory", num: 1, cell: (s) => fmtNum(s.in_memory) },
      { title: "Receivers", num: 1, cell: (s) => fmtNum(s.receivers) },
      { title: "Ring size", num: 1, cell: (s) => fmtNum(s.ring_size) },
      { title: "Newest", cell: (s) => (s.newest_ms ? fmtTime(s.newest_ms) : "–") },
    ], items, {
      empty: prefix.value ? `no stream starts with ${prefix.value}` : "no streams",
      attrs: { id: "stream-table" },
      rowAttrs: (s) => ({ "data-stream": s.stream, "data-waiting": s.waiting }),
    }));
    prev.disabled = page === 0;
    next.disabled = nextAfter === null;
  };
  const restart = () => { starts = [""]; page = 0; return load(); };
  const prev = h("button", { type: "button", id: "stream-prev",
    onclick: () => { page -= 1; load(); } }, "‹ Previous");
  const next = h("button", { type: "button", id: "stream-next", onclick: () => {
    if (nextAfter === null) return;
    starts = starts.slice(0, page + 1);
    starts.push(nextAfter);
    page += 1;
    load();
  } }, "Next ›");
  const form = h("form", { class: "toolbar", id: "stream-filter" },
    h("label", {}, "Id starts with", prefix),
    h("button", { type: "submit" }, "Filter"), prev, next, status);
  form.addEventListener("submit", (ev) => { ev.preventDefault(); restart(); });
  const el = h("div", {}, form, rows,
    h("p", { class: "muted" }, "A stream exists while it holds messages or receivers; an " +
      "empty one is forgotten after it was idle for stream_idle_ms."));
  return { el, reload: load };
}

// Send one message: POST /v1/streams/{stream}/messages. `fixed`: the stream of the page
// (the field is then not shown).
function sendForm(out, fixed, done) {
  const stream = fixed ? null : h("input", { id: "stream-send-stream", required: true,
    placeholder: "stream id", autocomplete: "off" });
  const value = h("textarea", { id: "stream-send-value", placeholder: "message (text)" });
  const uuid = h("input", { id: "stream-send-uuid", placeholder: "none (no deduplication)",
    autocomplete: "off" });
  const ttl = h("input", { id: "stream-send-ttl", type: "number", min: 0,
    placeholder: "broker default" });
  const persistent = h("input", { id: "stream-send-persistent", type: "checkbox", checked: true });
  const form = h("form", { class: "card", id: "stream-send" },
    h("h2", {}, fixed ? "Send a message" : "Send a test message"),
    h("p", { class: "muted" }, "A persistent message is written to the log and readable by " +
      "token until it expires; an in-memory one waits in the stream's ring for a receiver."),
    h("div", { class: "toolbar" }, stream ? h("label", {}, "Stream", stream) : null,
      h("label", {}, "Uuid", uuid), h("label", {}, "TTL (ms)", ttl),
      h("label", {}, "Persistent", persistent)),
    value, h("div", { class: "toolbar" },
      h("button", { class: "primary", type: "submit" }, "Send")));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clear(out);
    const id = fixed || stream.value;
    const body = { value: value.value, persistent: persistent.checked };
    if (uuid.value.trim() !== "") body.uuid = uuid.value.trim();
    if (ttl.value !== "") body.ttl_ms = Number(ttl.value);
    let r;
    try {
      r = await post(`/v1/streams/${enc(id)}/messages`, body);
    } catch (e) {
      out.append(note("error", `Sending to ${id}: ${refusal(e)}`));
      return;
    }
    if (r.status === "duplicate") {
      out.append(note("success", `Not stored: uuid ${body.uuid} was sent to ${id} before.`));
    } else {
      out.append(note("success", r.token ? `Sent to ${id}; its token is ${r.token}.`
        : `Sent to ${id} (in memory).`));
      value.value = "";
      uuid.value = ""; // a uuid names one message: the next one needs its own
    }
    await done(r);
  });
  return form;
}

export async function streamPage(main, stream) {
  const info = h("div", { id: "stream-info" });
  const out = h("div", { id: "stream-result" });
  const reader = readCard(stream);
  const draw = async () => {
    let s;
    try {
      s = await get(`/v1/streams/${enc(stream)}`);
    } catch (e) {
      details.hidden = true;
      if (e.status === 404) {
        put(info, note("error", `There is no stream ${stream} now: it holds no message and ` +
          "nobody waits on it (a send creates it)."));
        return;
      }
      put(info, note("error", `Describing ${stream}: ${refusal(e)}`));
      return;
    }
    const id = (k) => `stream-info-${k}`;
    put(info, h("div", { class: "cards" },
      [["waiting", "Waiting (work queue)"], ["persistent", "Persistent"],
        ["in_memory", "In memory"], ["receivers", "Receivers"], ["ring_size", "Ring size"]]
        .map(([k, label]) => stat(label, fmtNum(s[k]), id(k.replaceAll("_", "-"))))));
    details.hidden = false;
    put(details, h("h2", {}, "Details"), kvTable("stream-details", [
      ["partition of __streams", String(s.partition)],
      ["oldest message", s.oldest_ms ? fmtTime(s.oldest_ms) : "–"],
      ["newest message", s.newest_ms ? fmtTime(s.newest_ms) : "–"],
      ["token of the oldest persistent message", s.first_token || "–"],
      ["token after the newest", s.end_token || "–"],
    ]));
  };
  const details = h("div", { class: "card" });
  main.append(h("h1", {}, `Stream ${stream}`), info, out, reader.el,
    h("div", { class: "row" }, sendForm(out, stream, async () => { await draw(); }), details));
  await draw();
}

// Reading by token (GET /v1/streams/{stream}/read): the persistent messages at or after the
// token, without taking them. "Next" reads on from the token the answer gave.
function readCard(stream) {
  const token = h("input", { id: "stream-read-token", placeholder: "from the oldest",
    autocomplete: "off", size: 28 });
  const rows = h("div", { id: "stream-messages" });
  const status = h("span", { class: "muted", id: "stream-read-status" });
  let nextToken = null;
  const read = async (from) => {
    const qs = new URLSearchParams({ token: from, max: String(READ_MAX), wait_ms: "0" });
    let doc;
    try {
      doc = await get(`/v1/streams/${enc(stream)}/read?${qs}`);
    } catch (e) {
      put(rows, note("error", `Reading ${stream}: ${refusal(e)}`));
      return;
    }
    token.value = from;
    nextToken = doc.token;
    next.disabled = !doc.messages.length;
    put(status, doc.messages.length ? `${fmtNum(doc.messages.length)} message(s)`
      : "no message from this token (yet)");
    put(rows, table([
      { title: "Stored", cell: (m) => fmtTime(m.timestamp_ms) },
      { title: "Expires", cell: (m) => fmtTime(m.expires_at_ms) },
      { title: "Uuid", cls: "val", cell: (m) => m.uuid || "–" },
      { title: "Value", cls: "val", cell: (m) => (m.encoding === "base64"
        ? h("span", { title: "not UTF-8 text: shown base64" }, `base64: ${m.value}`) : m.value) },
      { title: "Token after it", cls: "val", cell: (m) => m.token },
    ], doc.messages, { empty: "no messages", attrs: { id: "stream-read-table" } }));
  };
  const go = h("button", { class: "primary", type: "submit" }, "Read");
  const next = h("button", { type: "button", id: "stream-read-next", disabled: true,
    onclick: () => { if (nextToken !== null) read(nextToken); } }, "Next ›");
  const form = h("form", { class: "toolbar", id: "stream-read" },
    h("label", {}, "Token (empty: from the oldest; $: only new ones)", token), go, next, status);
  form.addEventListener("submit", (ev) => { ev.preventDefault(); read(token.value.trim()); });
  const el = h("div", { class: "card" }, h("h2", {}, "Read by token"),
    h("p", { class: "muted" }, "The stream's persistent messages from a resume token, taken " +
      "by work-queue receivers or not; nothing is taken here. In-memory messages are not " +
      "readable by token."), form, rows);
  return { el };
}
