// Queues: every queue with its messages (ready, unacked, delayed), consumers, counters and
// rates (refreshed every few seconds), declare and delete; the exchanges and their bindings.
// A queue's page: its settings and counters, publishing a message to it, and the browser of
// its ready messages (a dead-letter queue's, typically) with replay and purge.

import { del, enc, get, getAll, post, api } from "./api.js";
import { clear, put, confirmDialog, fmtBytes, fmtNum, fmtTime, h, link, note, table } from "./ui.js";
import { refusal } from "./pages_topics.js";

const REFRESH_MS = 5000;
const BROWSE_PAGE = 50;

// The default exchange is "" to the broker; paths and people call it amq.default.
const exName = (n) => (n === "" ? "amq.default" : n);

function rate(now, before, field, seconds) {
  if (!before || seconds <= 0) return null;
  const d = now.counters[field] - before.counters[field];
  return d >= 0 ? d / seconds : null;
}

export async function queuesPage(main) {
  const out = h("div");
  const list = h("div", { id: "queue-list" });
  const exchanges = h("div", { id: "exchange-list" });
  const bindings = h("div", { id: "binding-list" });
  let previous = new Map();
  let previousAt = 0;
  let timer = null;
  const draw = async () => {
    let doc;
    try {
      doc = await get("/v1/queues");
    } catch (e) {
      put(list, note("error", `Listing queues failed: ${refusal(e)}`));
      return;
    }
    const at = performance.now();
    const seconds = previousAt ? (at - previousAt) / 1000 : 0;
    const rates = new Map(doc.queues.map((q) => [q.name, {
      in: rate(q, previous.get(q.name), "published", seconds),
      acked: rate(q, previous.get(q.name), "acked", seconds),
    }]));
    previous = new Map(doc.queues.map((q) => [q.name, q]));
    previousAt = at;
    const perS = (v) => (v === null || v === undefined ? "–" : `${fmtNum(v)}/s`);
    put(list, table([
      { title: "Queue", cell: (q) => link(`#/queue/${enc(q.name)}`, q.name) },
      { title: "Ready", num: 1, cell: (q) => fmtNum(q.ready) },
      { title: "Unacked", num: 1, cell: (q) => fmtNum(q.unacked) },
      { title: "Delayed", num: 1, cell: (q) => fmtNum(q.delayed) },
      { title: "Consumers", num: 1, cell: (q) => fmtNum(q.consumers) },
      { title: "Size", num: 1, cell: (q) => fmtBytes(q.bytes) },
      { title: "Published", num: 1, cell: (q) => fmtNum(q.counters.published) },
      { title: "In rate", num: 1, cell: (q) => perS(rates.get(q.name).in) },
      { title: "Acked", num: 1, cell: (q) => fmtNum(q.counters.acked) },
      { title: "Ack rate", num: 1, cell: (q) => perS(rates.get(q.name).acked) },
      { title: "Redelivered", num: 1, cell: (q) => fmtNum(q.counters.redelivered) },
      { title: "Dead-lettered", num: 1, cell: (q) => fmtNum(q.counters.dead_lettered) },
      { title: "Expired", num: 1, cell: (q) => fmtNum(q.counters.expired) },
      { title: "", cell: (q) => h("button", { class: "danger", "data-delete-queue": q.name,
        onclick: () => remove(q.name) }, "Delete") },
    ], doc.queues, {
      empty: "no queues",
      rowAttrs: (q) => ({ "data-queue": q.name, "data-ready": q.ready }),
    }));
  };
  const drawExchanges = async () => {
    try {
      const [ex, bs] = await getAll("/v1/exchanges", "/v1/bindings");
      put(exchanges, table([
        { title: "Exchange", cls: "val", cell: (x) => exName(x.name) },
        { title: "Type", cell: (x) => x.type },
        { title: "Durable", cell: (x) => (x.durable ? "yes" : "no") },
        { title: "Alternate", cell: (x) => x.alternate_exchange || "–" },
      ], ex.exchanges, { empty: "no exchanges" }));
      put(bindings, table([
        { title: "Exchange", cls: "val", cell: (b) => exName(b.exchange) },
        { title: "Destination", cell: (b) => (b.destination_kind === "queue"
          ? link(`#/queue/${enc(b.destination)}`, b.destination)
          : link(`#/topic/${enc(b.destination)}`, `topic ${b.destination}`)) },
        { title: "Key", cls: "val", cell: (b) => b.key || "–" },
        { title: "Arguments", cls: "val", cell: (b) => Object.entries(b.arguments)
          .map(([k, v]) => `${k}=${v}`).join(", ") || "–" },
      ], bs.bindings, { empty: "no bindings (every queue is bound to amq.default by its name)" }));
    } catch (e) {
      put(exchanges, note("error", `Listing exchanges failed: ${refusal(e)}`));
    }
  };
  const remove = async (name) => {
    clear(out);
    if (!(await confirmDialog(`Delete queue ${name}`,
      "The queue and every message in it are deleted. This cannot be undone.",
      { typed: name, action: "Delete" }))) return;
    try {
      const r = await del(`/v1/queues/${enc(name)}`);
      out.append(note("success", `Deleted queue ${name} (${fmtNum(r.messages)} messages).`));
    } catch (e) {
      out.append(note("error", `Deleting ${name}: ${refusal(e)}`));
    }
    draw();
  };
  main.append(h("h1", {}, "Queues"), declareForm(out, draw), out, list,
    h("p", { class: "muted" }, `Rates over the last ${REFRESH_MS / 1000} s; refreshed every ` +
      `${REFRESH_MS / 1000} s.`),
    h("h2", {}, "Exchanges"), exchanges, h("h2", {}, "Bindings"), bindings);
  await Promise.all([draw(), drawExchanges()]);
  timer = setInterval(draw, REFRESH_MS);
  return () => clearInterval(timer);
}

function declareForm(out, done) {
  const name = h("input", { id: "new-queue-name", required: true, placeholder: "name" });
  const durable = h("input", { id: "new-queue-durable", type: "checkbox", checked: true });
  const dlx = h("input", { id: "new-queue-dlx", placeholder: "none" });
  const dlk = h("input", { id: "new-queue-dlk", placeholder: "the message's own" });
  const form = h("form", { class: "toolbar card", id: "declare-queue" },
    h("label", {}, "New queue", name), h("label", {}, "Durable", durable),
    h("label", {}, "Dead-letter exchange", dlx), h("label", {}, "Dead-letter routing key", dlk),
    h("button", { class: "primary", type: "submit" }, "Declare"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clear(out);
    const q = name.value.trim();
    const body = { durable: durable.checked };
    if (dlx.value.trim() !== "") body.dead_letter_exchange = dlx.value.trim();
    if (dlk.value.trim() !== "") body.dead_letter_routing_key = dlk.value.trim();
    try {
      await api("PUT", `/v1/queues/${enc(q)}`, body);
      out.append(note("success", `Declared queue ${q}.`));
      name.value = "";
      done();
    } catch (e) {
      out.append(note("error", `Declaring ${q}: ${refusal(e)}`));
    }
  });
  return form;
}

export async function queuePage(main, name) {
  const info = h("div", { id: "queue-info" });
  const details = h("div", { class: "row" });
  const out = h("div", { id: "queue-result" });
  const draw = async () => {
    const q = await get(`/v1/queues/${enc(name)}`);
    const settings = [
      ["durable", q.durable ? "yes" : "no"], ["auto delete", q.auto_delete ? "yes" : "no"],
      ["max deliveries", q.max_deliveries || "–"], ["message TTL (ms)", q.message_ttl_ms || "–"],
      ["max length", q.max_length || "–"], ["max length (bytes)", q.max_length_bytes || "–"],
      ["overflow", q.overflow],
      ["dead-letter exchange", q.dead_letter_exchange === null ? "–" : exName(q.dead_letter_exchange)],
      ["dead-letter routing key", q.dead_letter_routing_key || "–"],
      ["visibility timeout (ms)", q.visibility_timeout_ms || "–"],
    ];
    const id = (k) => `queue-${k.replaceAll("_", "-")}`;
    put(info, h("div", { class: "cards" },
      [["ready", q.ready], ["unacked", q.unacked], ["delayed", q.delayed],
        ["consumers", q.consumers], ["bytes", fmtBytes(q.bytes)]].map(([k, v]) =>
        h("div", { class: "card stat" }, h("div", { class: "label" }, k),
          h("div", { class: "value", id: id(k) }, typeof v === "number" ? fmtNum(v) : v)))));
    put(details,
      h("div", { class: "card" }, h("h2", {}, "Counters since start"), table([
        { title: "Fate", cell: (r) => r[0].replaceAll("_", " ") },
        { title: "Messages", num: 1, cell: (r) => h("span", { id: id(r[0]) }, fmtNum(r[1])) },
      ], Object.entries(q.counters))),
      h("div", { class: "card" }, h("h2", {}, "Settings"), table([
        { title: "Setting", cell: (r) => r[0] }, { title: "Value", cell: (r) => String(r[1]) },
      ], settings)));
  };
  const browser = browseCard(name, out, draw);
  main.append(h("h1", {}, `Queue ${name}`), info, out, browser.el,
    publishForm(name, out, async () => {
      await draw();
      await browser.reload();
    }), details);
  await draw();
  await browser.reload();
}

function publishForm(queue, out, done) {
  const value = h("textarea", { id: "queue-publish-value", placeholder: "message body" });
  const form = h("form", { class: "card", id: "queue-publish" },
    h("h2", {}, "Publish"),
    h("p", { class: "muted" }, `To the default exchange with routing key ${queue}: this queue alone.`),
    value, h("div", { class: "toolbar" },
      h("button", { class: "primary", type: "submit" }, "Publish")));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clear(out);
    try {
      await post("/v1/exchanges/amq.default/publish",
        { routing_key: queue, messages: [{ value: value.value }] });
      out.append(note("success", `Published to ${queue}.`));
      value.value = "";
      await done();
    } catch (e) {
      out.append(note("error", `Publishing: ${refusal(e)}`));
    }
  });
  return form;
}

function deathOf(m) {
  const raw = m.headers["x-death"];
  if (!raw || m.encoding !== "utf-8") return null;
  try {
    const d = JSON.parse(raw);
    return Array.isArray(d) && d.length ? d[0] : null;
  } catch {
    return null;
  }
}

function browseCard(queue, out, redraw) {
  const rows = h("div", { id: "dlq-messages" });
  const status = h("span", { class: "muted", id: "dlq-status" });
  let from = 0;
  let nextFrom = 0;
  let shown = [];
  const selected = new Set();
  const load = async () => {
    let doc;
    try {
      doc = await get(`/v1/queues/${enc(queue)}/dlq?from_offset=${from}&max_messages=${BROWSE_PAGE}`);
    } catch (e) {
      put(rows, note("error", `Browsing ${queue}: ${refusal(e)}`));
      return;
    }
    shown = doc.messages;
    selected.clear();
    put(status, shown.length ? `offsets ${fmtNum(shown[0].offset)}–` +
      `${fmtNum(shown[shown.length - 1].offset)}` : "no ready messages from here");
    put(rows, table([
      { title: "", cell: (m) => h("input", { type: "checkbox", "data-offset": m.offset,
        onchange: (ev) => (ev.target.checked ? selected.add(m.offset) : selected.delete(m.offset)) }) },
      { title: "Offset", num: 1, cell: (m) => m.offset },
      { title: "Time", cell: (m) => fmtTime(m.timestamp) },
      { title: "Routing key", cls: "val", cell: (m) => m.routing_key ?? "–" },
      { title: "Value", cls: "val", cell: (m) => m.value ?? "null" },
      { title: "Died in", cell: (m) => (deathOf(m) ? deathOf(m).queue : "–") },
      { title: "Reason", cell: (m) => (deathOf(m) ? `${deathOf(m).reason} ×${deathOf(m).count}` : "–") },
    ], shown, { empty: "no ready messages", attrs: { id: "dlq-table" } }));
    next.disabled = shown.length < BROWSE_PAGE;
    first.disabled = from === 0;
    nextFrom = doc.next_offset;
  };
  const first = h("button", { type: "button", id: "dlq-first",
    onclick: () => { from = 0; load(); } }, "« First");
  const next = h("button", { type: "button", id: "dlq-next",
    onclick: () => { from = nextFrom; load(); } }, "Next ›");
  const replay = async (body, what) => {
    clear(out);
    try {
      const r = await post(`/v1/queues/${enc(queue)}/dlq/replay`, body);
      out.append(note("success", `Replayed ${fmtNum(r.messages)} message(s) ${what}.`));
    } catch (e) {
      out.append(note("error", `Replay: ${refusal(e)}`));
    }
    await redraw();
    await load();
  };
  const replaySelected = h("button", { type: "button", id: "dlq-replay-selected",
    onclick: () => {
      if (!selected.size) {
        clear(out);
        out.append(note("error", "Select the messages to replay first."));
        return;
      }
      replay({ offsets: [...selected].sort((a, b) => a - b) }, "(the selected ones)");
    } }, "Replay selected");
  const replayAll = h("button", { type: "button", id: "dlq-replay-all", onclick: async () => {
    if (!(await confirmDialog(`Replay ${queue}`, "Move every ready message of this queue back " +
      "to the queue it was dead-lettered from?", { action: "Replay all", danger: false }))) return;
    replay({ all: true }, "(all)");
  } }, "Replay all");
  const purge = h("button", { type: "button", class: "danger", id: "dlq-purge", onclick: async () => {
    if (!(await confirmDialog(`Purge ${queue}`, "Every ready message of this queue is " +
      "removed. This cannot be undone.", { typed: queue, action: "Purge" }))) return;
    clear(out);
    try {
      const r = await post(`/v1/queues/${enc(queue)}/dlq/purge`);
      out.append(note("success", `Purged ${fmtNum(r.messages)} message(s) from ${queue}.`));
    } catch (e) {
      out.append(note("error", `Purge: ${refusal(e)}`));
    }
    await redraw();
    await load();
  } }, "Purge");
  const el = h("div", { class: "card", id: "dlq" },
    h("h2", {}, "Ready messages"),
    h("p", { class: "muted" }, "Looked at, not delivered. In a dead-letter queue each says " +
      "where it died and why; replay moves it back there."),
    h("div", { class: "toolbar" }, first, next, status, replaySelected, replayAll, purge), rows);
  return { el, reload: load };
}
