// Live tail of a topic over the WebSocket stream (GET /v1/topics/{topic}/stream upgraded):
// filters on key, partition and value, pause, and at most MAX_ROWS rows on the page.

import { enc, get } from "./api.js";
import { clear, fmtTime, h, note } from "./ui.js";

export const MAX_ROWS = 500;
// Credit given back once this many messages arrived (the first grant is the stream's
// default, 1,000 messages and 1 MiB).
const CREDIT_EVERY = 100;
const utf8 = new TextEncoder();

export async function tailPage(main, topic) {
  if (!topic) {
    const doc = await get("/v1/topics?limit=200&sort=name");
    main.append(h("h1", {}, "Live tail"), h("p", {}, "Pick a topic:"),
      h("ul", {}, doc.topics.map((t) => h("li", {}, h("a", { href: `#/tail/${enc(t.name)}` }, t.name)))));
    return null;
  }
  const fKey = h("input", { id: "tail-key", placeholder: "key contains" });
  const fPart = h("input", { id: "tail-partition", type: "number", min: 0, placeholder: "any" });
  const fValue = h("input", { id: "tail-value", placeholder: "value contains" });
  const from = h("select", { id: "tail-from" }, h("option", { value: "latest" }, "new messages"),
    h("option", { value: "earliest" }, "the oldest"));
  const pause = h("button", { id: "tail-pause", type: "button" }, "Pause");
  const clearBtn = h("button", { type: "button", id: "tail-clear" }, "Clear");
  const status = h("span", { class: "tail-status muted", id: "tail-status" }, "connecting…");
  const tbody = h("tbody", { id: "tail-rows" });
  const errors = h("div");
  main.append(h("h1", {}, `Live tail of ${topic}`),
    h("div", { class: "toolbar" }, h("label", {}, "Key", fKey), h("label", {}, "Partition", fPart),
      h("label", {}, "Value", fValue), h("label", {}, "Start from", from), pause, clearBtn, status),
    errors,
    h("table", {}, h("thead", {}, h("tr", {}, ["Partition", "Offset", "Time", "Key", "Value"]
      .map((c, i) => h("th", { class: i < 2 ? "num" : "" }, c)))), tbody));

  let paused = false, seen = 0, shown = 0, held = [], ws = null, pending = 0, pendingBytes = 0;
  const matches = (m) => (!fKey.value || String(m.key ?? "").includes(fKey.value)) &&
    (fPart.value === "" || m.partition === Number(fPart.value)) &&
    (!fValue.value || String(m.value ?? "").includes(fValue.value));
  const row = (m) => h("tr", {}, h("td", { class: "num" }, m.partition),
    h("td", { class: "num" }, m.offset), h("td", {}, fmtTime(m.timestamp)),
    h("td", { class: "val" }, m.key ?? "null"), h("td", { class: "val" }, m.value ?? "null"));
  const add = (m) => {
    if (!matches(m)) return;
    tbody.prepend(row(m));
    shown++;
    while (tbody.childElementCount > MAX_ROWS) tbody.lastElementChild.remove();
  };
  const say = () => {
    status.textContent = `${paused ? "paused" : "live"} · ${seen} received · ` +
      `${tbody.childElementCount} shown (last ${MAX_ROWS} at most)` +
      (held.length ? ` · ${held.length} held while paused` : "");
  };
  pause.addEventListener("click", () => {
    paused = !paused;
    pause.textContent = paused ? "Resume" : "Pause";
    if (!paused) { held.forEach(add); held = []; }
    say();
  });
  clearBtn.addEventListener("click", () => { clear(tbody); say(); });
  const connect = () => {
    if (ws) ws.close(1000);
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    ws = new WebSocket(`${proto}//${location.host}/v1/topics/${enc(topic)}/stream?from=${from.value}`);
    ws.addEventListener("message", (ev) => {
      let doc;
      try { doc = JSON.parse(ev.data); } catch { return; }
      const list = Array.isArray(doc) ? doc : [doc];
      for (const m of list) {
        if (m.type === "error") { errors.append(note("error", `Stream: ${m.error.message}`)); continue; }
        if (m.type === "subscribed") { status.dataset.subscribed = "1"; say(); continue; }
        if (m.type !== "message") continue;
        seen++;
        pending++;
        if (paused) {
          held.push(m);
          if (held.length > MAX_ROWS) held.shift();
        } else {
          add(m);
        }
      }
      if (list.some((m) => m.type === "message")) pendingBytes += utf8.encode(ev.data).length;
      if (pending >= CREDIT_EVERY) {
        ws.send(JSON.stringify({ type: "credit", messages: pending, bytes: pendingBytes }));
        pending = 0;
        pendingBytes = 0;
      }
      say();
    });
    ws.addEventListener("close", (ev) => {
      if (ev.code !== 1000) {
        status.textContent = "closed";
        errors.append(note("error", `The stream closed (code ${ev.code}${ev.reason ? `: ${ev.reason}` : ""}).`));
      }
    });
  };
  from.addEventListener("change", () => { clear(tbody); seen = 0; connect(); });
  connect();
  return () => { if (ws) ws.close(1000); };
}
