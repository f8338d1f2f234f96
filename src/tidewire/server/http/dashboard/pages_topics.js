// Topics: the server-side paginated list (filter, sort), create, delete with a typed-name
// confirmation; a topic's partitions and settings (alter), the message browser (by
// partition and offset or by time, search, export of the selected messages as JSON or CSV,
// copy a message to a topic) and producing a message.

import { ApiError, api, can, del, enc, get, patch, post } from "./api.js";
import {
  clear, put, confirmDialog, download, fmtBytes, fmtMs, fmtNum, fmtTime, h, link, note,
  table,
} from "./ui.js";

const PAGE = 50;
const CONFIG_KEYS = ["retention_ms", "retention_bytes", "segment_bytes", "segment_ms", "fsync",
  "flush_interval_ms", "max_message_bytes"];

// One page of a list route that may or may not paginate itself: with `total` in the answer
// the broker did the work; without, the page is cut here from the whole list.
export async function listPage(path, key, { q, sort, offset, match }) {
  const qs = new URLSearchParams({ limit: String(PAGE), offset: String(offset) });
  if (q) qs.set("q", q);
  if (sort) qs.set("sort", sort);
  const doc = await get(`${path}?${qs}`);
  let items = doc[key];
  if (typeof doc.total === "number") return { items, total: doc.total };
  if (q) items = items.filter((t) => match(t).toLowerCase().includes(q.toLowerCase()));
  if (sort) {
    const desc = sort.startsWith("-");
    const f = desc ? sort.slice(1) : sort;
    const v = (x) => (f === "name" ? match(x) : f === "size" ? x.size_bytes : x[f]);
    items = [...items].sort((a, b) => (v(a) < v(b) ? -1 : v(a) > v(b) ? 1 : 0) * (desc ? -1 : 1));
  }
  return { items: items.slice(offset, offset + PAGE), total: items.length };
}

export function pager(state, total, redraw) {
  const last = Math.max(0, Math.ceil(total / PAGE) - 1);
  const page = Math.floor(state.offset / PAGE);
  return h("div", { class: "pager" },
    h("button", { disabled: page === 0, id: "prev",
      onclick: () => { state.offset -= PAGE; redraw(); } }, "‹ Previous"),
    h("span", { class: "muted" }, `page ${page + 1} of ${last + 1} · ${fmtNum(total)} in all`),
    h("button", { disabled: page >= last, id: "next",
      onclick: () => { state.offset += PAGE; redraw(); } }, "Next ›"));
}

export async function topicsPage(main) {
  const state = { q: "", sort: "name", offset: 0 };
  const filter = h("input", { placeholder: "filter by name", id: "topic-filter" });
  const list = h("div", { id: "topic-list" });
  const out = h("div");
  let debounce = null;
  filter.addEventListener("input", () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => { state.q = filter.value.trim(); state.offset = 0; draw(); }, 250);
  });
  const draw = async () => {
    let got;
    try {
      got = await listPage("/v1/topics", "topics", { ...state, match: (t) => t.name });
    } catch (e) {
      put(list, note("error", `Listing topics failed: ${e.message}`));
      return;
    }
    const onSort = (f) => { state.sort = state.sort === f ? `-${f}` : f; draw(); };
    put(list, table([
      { title: "Name", sort: "name", cell: (t) => link(`#/topic/${enc(t.name)}`, t.name) },
      { title: "Partitions", sort: "partitions", num: 1, cell: (t) => t.partitions },
      { title: "Messages", sort: "messages", num: 1, cell: (t) => (t.messages === undefined ? "–" : fmtNum(t.messages)) },
      { title: "Size", sort: "size", num: 1, cell: (t) => (t.size_bytes === undefined ? "–" : fmtBytes(t.size_bytes)) },
      { title: "", cell: (t) => [
        can("read_messages") ? [link(`#/tail/${enc(t.name)}`, "tail"), " "] : null,
        can("delete_topics") ? h("button", { class: "danger", "data-delete": t.name,
          onclick: () => remove(t.name) }, "Delete") : null] },
    ], got.items, { onSort, sorted: state.sort, empty: "no topics" }),
    pager(state, got.total, draw));
  };
  const remove = async (name) => {
    clear(out);
    if (!(await confirmDialog(`Delete topic ${name}`,
      "Every message of the topic is deleted. This cannot be undone.",
      { typed: name, action: "Delete" }))) return;
    try {
      await del(`/v1/topics/${enc(name)}`);
      out.append(note("success", `Deleted topic ${name}.`));
    } catch (e) {
      out.append(note("error", `Deleting ${name}: ${refusal(e)}`));
    }
    draw();
  };
  main.append(h("h1", {}, "Topics"),
    can("create_topics") ? createForm(out, draw) : null, out,
    h("div", { class: "toolbar" }, h("label", {}, "Filter", filter)), list);
  await draw();
}

export function refusal(e) {
  if (e instanceof ApiError && e.status === 403) return `refused: no permission (${e.message})`;
  return e.message;
}

function createForm(out, done) {
  const name = h("input", { id: "new-topic-name", required: true, placeholder: "name" });
  const parts = h("input", { id: "new-topic-partitions", type: "number", min: 1, value: "1" });
  const retention = h("input", { id: "new-topic-retention", type: "number", min: -1,
    placeholder: "broker default" });
  const form = h("form", { class: "toolbar card", id: "create-topic" },
    h("label", {}, "New topic", name), h("label", {}, "Partitions", parts),
    h("label", {}, "Retention (ms)", retention),
    h("button", { class: "primary", type: "submit" }, "Create"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clear(out);
    const body = { name: name.value.trim(), partitions: Number(parts.value) };
    if (retention.value !== "") body.config = { retention_ms: Number(retention.value) };
    try {
      await post("/v1/topics", body);
      out.append(note("success", `Created topic ${body.name}.`));
      name.value = "";
      done();
    } catch (e) {
      out.append(note("error", `Creating ${body.name}: ${refusal(e)}`));
    }
  });
  return form;
}

export async function topicPage(main, name) {
  const t = await get(`/v1/topics/${enc(name)}`);
  const out = h("div");
  main.append(h("h1", {}, `Topic ${name} `, link(`#/tail/${enc(name)}`, "(live tail)")), out);
  const totalSize = t.partitions.reduce((a, p) => a + p.size_bytes, 0);
  const totalMsgs = t.partitions.reduce((a, p) => a + (p.end_offset - p.start_offset), 0);
  main.append(h("div", { class: "row" },
    h("div", { class: "card" }, h("h2", {}, "Partitions"),
      table([
        { title: "Partition", num: 1, cell: (p) => p.partition },
        { title: "Start offset", num: 1, cell: (p) => fmtNum(p.start_offset) },
        { title: "End offset", num: 1, cell: (p) => fmtNum(p.end_offset) },
        { title: "High watermark", num: 1, cell: (p) => fmtNum(p.high_watermark) },
        { title: "Size", num: 1, cell: (p) => fmtBytes(p.size_bytes) },
        { title: "State", cell: (p) => (p.offline ? `offline: ${p.offline}`
          : p.damage ? `${p.damage.length} damaged range(s)` : "ok") },
      ], t.partitions, { attrs: { id: "partitions" } }),
      h("p", { class: "muted" }, `${fmtNum(totalMsgs)} messages, ${fmtBytes(totalSize)}; ` +
        `retention ${fmtMs(t.config.retention_ms)}, ` +
        `${t.config.retention_bytes < 0 ? "no size limit" : fmtBytes(t.config.retention_bytes)}`)),
    configCard(name, t.config, t.partitions.length, out)));
  if (can("read_messages")) main.append(browser(name, t.partitions.length));
  if (can("publish")) main.append(produceCard(name, t.partitions.length));
}

function configCard(name, config, partitions, out) {
  const inputs = {};
  const rows = CONFIG_KEYS.map((k) => {
    inputs[k] = k === "fsync"
      ? h("select", { name: k }, ["always", "interval", "never"].map((v) =>
        h("option", { value: v, selected: config[k] === v }, v)))
      : h("input", { name: k, type: "number", value: String(config[k]) });
    return h("tr", {}, h("td", {}, k), h("td", {}, inputs[k]));
  });
  const parts = h("input", { name: "partitions", type: "number", min: partitions,
    value: String(partitions) });
  rows.unshift(h("tr", {}, h("td", {}, "partitions (more only)"), h("td", {}, parts)));
  const save = h("button", { class: "primary", type: "submit" }, "Save settings");
  const form = h("form", { class: "card", id: "alter-topic" }, h("h2", {}, "Settings"),
    h("table", {}, h("tbody", {}, rows)), can("alter_topics") ? save : null);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clear(out);
    const changed = {};
    for (const k of CONFIG_KEYS) {
      const v = k === "fsync" ? inputs[k].value : Number(inputs[k].value);
      if (v !== config[k]) changed[k] = v;
    }
    const body = {};
    if (Object.keys(changed).length) body.config = changed;
    if (Number(parts.value) !== partitions) body.partitions = Number(parts.value);
    if (!Object.keys(body).length) { out.append(note("success", "Nothing changed.")); return; }
    try {
      await patch(`/v1/topics/${enc(name)}`, body);
      Object.assign(config, changed);
      const what = [...Object.keys(changed), ...(body.partitions ? ["partitions"] : [])];
      out.append(note("success", `Saved ${what.join(", ")}.`));
      if (body.partitions) location.reload();
    } catch (e) {
      out.append(note("error", `Altering ${name}: ${refusal(e)}`));
    }
  });
  return form;
}

function csvCell(v) {
  const s = v === null || v === undefined ? "" : typeof v === "object" ? JSON.stringify(v) : String(v);
  return /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

export function toCsv(messages) {
  const cols = ["partition", "offset", "timestamp", "key", "value", "headers", "encoding"];
  return [cols.join(","), ...messages.map((m) => cols.map((c) => csvCell(m[c])).join(","))]
    .join("\r\n") + "\r\n";
}

function browser(topic, partitions) {
  const mode = h("select", { id: "browse-mode" },
    h("option", { value: "offset" }, "partition + offset"),
    h("option", { value: "time" }, "timestamp"));
  const part = h("select", { id: "browse-partition" },
    Array.from({ length: partitions }, (_, i) => h("option", { value: String(i) }, String(i))));
  const offset = h("input", { id: "browse-offset", type: "number", min: 0, placeholder: "oldest" });
  const since = h("input", { id: "browse-since", type: "datetime-local", step: 1 });
  const limit = h("input", { id: "browse-limit", type: "number", min: 1, max: 10000, value: "100" });
  const search = h("input", { id: "browse-search", placeholder: "text in key or value" });
  const exactKey = h("input", { id: "browse-key", placeholder: "any" });
  const result = h("div", { id: "messages" });
  const status = h("div");
  let messages = [];
  const selected = new Set();
  const showMode = () => {
    const byTime = mode.value === "time";
    part.parentElement.hidden = byTime;
    offset.parentElement.hidden = byTime;
    since.parentElement.hidden = !byTime;
  };
  mode.addEventListener("change", showMode);
  const load = async (ev) => {
    if (ev) ev.preventDefault();
    clear(status);
    const qs = new URLSearchParams({ limit: limit.value || "100" });
    const q = search.value.trim();
    if (q) qs.set("q", q);
    if (exactKey.value !== "") qs.set("key", exactKey.value);
    let path;
    if (mode.value === "time") {
      qs.set("since", String(since.value ? new Date(`${since.value}Z`).getTime() : 0));
      path = `/v1/topics/${enc(topic)}/messages?${qs}`;
    } else {
      if (offset.value !== "") qs.set("offset", offset.value);
      path = `/v1/topics/${enc(topic)}/partitions/${part.value}/messages?${qs}`;
    }
    try {
      const page = await get(path);
      // The broker filters by q where it can; the same test here keeps a broker that does
      // not from showing what does not match.
      const low = q.toLowerCase();
      messages = page.messages.filter((m) => (!q ||
        [m.key, m.value, ...Object.values(m.headers || {})]
          .some((v) => String(v ?? "").toLowerCase().includes(low))) &&
        (exactKey.value === "" || m.key === exactKey.value));
      selected.clear();
      if (page.next_offset !== undefined) offset.value = "";
      status.append(h("span", { class: "muted" }, `${messages.length} message(s)` +
        (page.scanned !== undefined ? ` of ${page.scanned} looked at` : "") +
        (page.next_offset !== undefined ? `; next offset ${page.next_offset}, ` +
          `high watermark ${page.high_watermark}` : "")));
      if (mode.value === "offset") {
        // The same read as a file made by the broker (the whole range, not only the ticked).
        const file = (fmt) => {
          const f = new URLSearchParams(qs);
          f.set("format", fmt);
          return h("a", { href: `${path.split("?")[0]}?${f}`, download: `${topic}.${fmt}`,
            id: `broker-export-${fmt}` }, fmt.toUpperCase());
        };
        status.append(" · as a file from the broker: ", file("json"), " ", file("csv"));
      }
      if (page.next_offset !== undefined && messages.length) {
        status.append(" ", h("button", { type: "button", id: "browse-more",
          onclick: () => { offset.value = String(page.next_offset); load(); } }, "Next page ›"));
      }
    } catch (e) {
      messages = [];
      status.append(note("error", `Reading messages: ${refusal(e)}`));
    }
    draw();
  };
  const all = h("input", { type: "checkbox", "aria-label": "select all", id: "select-all" });
  all.addEventListener("change", () => {
    for (let i = 0; i < messages.length; i++) (all.checked ? selected.add(i) : selected.delete(i));
    draw();
  });
  const draw = () => {
    put(result, table([
      { title: all, cell: (m) => {
        const i = messages.indexOf(m);
        const box = h("input", { type: "checkbox", checked: selected.has(i), "aria-label": "select" });
        box.addEventListener("change", () => (box.checked ? selected.add(i) : selected.delete(i)));
        return box;
      } },
      { title: "Partition", num: 1, cell: (m) => m.partition },
      { title: "Offset", num: 1, cell: (m) => m.offset },
      { title: "Time", cell: (m) => fmtTime(m.timestamp) },
      { title: "Key", cls: "val", cell: (m) => m.key ?? "null" },
      { title: "Value", cls: "val", cell: (m) => m.value ?? "null" },
      { title: "Headers", cls: "val", cell: (m) => (Object.keys(m.headers || {}).length
        ? JSON.stringify(m.headers) : "") },
      { title: "", cell: (m) => (can("publish")
        ? h("button", { type: "button", onclick: () => copyTo(m) }, "Copy to…") : null) },
    ], messages, { empty: "no messages here" }));
  };
  const chosen = () => messages.filter((_, i) => selected.has(i));
  const exportAs = (kind) => {
    const ms = chosen().length ? chosen() : messages;
    if (!ms.length) { put(status, note("error", "Nothing to export: read messages first.")); return; }
    if (kind === "json") download(`${topic}.json`, JSON.stringify(ms, null, 2), "application/json");
    else download(`${topic}.csv`, toCsv(ms), "text/csv");
  };
  const copyTo = async (m) => {
    const target = h("input", { id: "copy-target", value: topic });
    const ok = await new Promise((resolve) => {
      const done = (v) => { back.remove(); resolve(v); };
      const back = h("div", { class: "modal-back" }, h("div", { class: "modal", role: "dialog" },
        h("h2", {}, `Copy offset ${m.offset} of partition ${m.partition}`),
        h("label", {}, "To topic", target),
        h("div", { class: "actions" }, h("button", { onclick: () => done(false) }, "Cancel"),
          h("button", { class: "primary", id: "copy-ok", onclick: () => done(true) }, "Publish"))));
      document.body.append(back);
      target.focus();
    });
    if (!ok) return;
    clear(status);
    try {
      const r = await post(`/v1/topics/${enc(target.value)}/messages`, {
        key: m.key, value: m.value, headers: m.headers, encoding: m.encoding });
      status.append(note("success", `Published to ${target.value}: partition ${r.partition}, offset ${r.offset}.`));
    } catch (e) {
      status.append(note("error", `Publishing to ${target.value}: ${refusal(e)}`));
    }
  };
  const form = h("form", { class: "toolbar", id: "browse" },
    h("label", {}, "Read by", mode), h("label", {}, "Partition", part),
    h("label", {}, "From offset", offset), h("label", {}, "From time (UTC)", since),
    h("label", {}, "Limit", limit), h("label", {}, "Search", search),
    h("label", {}, "Key (exact)", exactKey),
    h("button", { class: "primary", type: "submit", id: "browse-read" }, "Read"),
    h("button", { type: "button", id: "export-json", onclick: () => exportAs("json") }, "Export JSON"),
    h("button", { type: "button", id: "export-csv", onclick: () => exportAs("csv") }, "Export CSV"));
  form.addEventListener("submit", load);
  showMode();
  draw();
  load();
  return h("div", { class: "card" }, h("h2", {}, "Messages"), form, status, result);
}

function produceCard(topic, partitions) {
  const key = h("input", { id: "produce-key", placeholder: "none" });
  const value = h("textarea", { id: "produce-value" });
  const headers = h("input", { id: "produce-headers", placeholder: '{"name": "value"}' });
  const part = h("select", { id: "produce-partition" }, h("option", { value: "" }, "by key"),
    Array.from({ length: partitions }, (_, i) => h("option", { value: String(i) }, String(i))));
  const out = h("div");
  const form = h("form", { class: "card", id: "produce" }, h("h2", {}, "Produce a message"),
    h("div", { class: "toolbar" }, h("label", {}, "Key", key), h("label", {}, "Partition", part),
      h("label", {}, "Headers (JSON)", headers)),
    h("label", {}, "Value", value),
    h("div", { class: "toolbar" }, h("button", { class: "primary", type: "submit" }, "Publish")), out);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clear(out);
    const body = { value: value.value };
    if (key.value !== "") body.key = key.value;
    if (part.value !== "") body.partition = Number(part.value);
    if (headers.value.trim()) {
      try { body.headers = JSON.parse(headers.value); } catch (e) {
        out.append(note("error", `Headers are not JSON: ${e.message}`));
        return;
      }
    }
    try {
      const r = await post(`/v1/topics/${enc(topic)}/messages`, body);
      out.append(note("success", `Published: partition ${r.partition}, offset ${r.offset}.`));
    } catch (e) {
      out.append(note("error", `Publishing: ${refusal(e)}`));
    }
  });
  return form;
}

