// Small DOM helpers: elements built with text nodes only (never innerHTML with data), a
// banner for what failed, tables, a confirmation dialog and number formats.

import { describeError } from "./api.js";

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "value") el.value = v;
    else if (k === "checked") el.checked = Boolean(v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// Replace the children of `el` (arrays flattened, null and false left out).
export function put(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

const banner = () => document.getElementById("banner");

export function showError(e, context) {
  const b = banner();
  b.className = "banner";
  b.textContent = (context ? `${context}: ` : "") + describeError(e);
  b.hidden = false;
}

export function showInfo(text) {
  const b = banner();
  b.className = "banner info";
  b.textContent = text;
  b.hidden = false;
}

export function hideBanner() {
  const b = banner();
  b.hidden = true;
  b.textContent = "";
}

// A message inside a page section (kept next to what it is about).
export function note(kind, text) {
  return h("div", { class: `msg ${kind}`, role: kind === "error" ? "alert" : "status" }, text);
}

export function table(columns, rows, opts = {}) {
  const head = h("tr", {}, columns.map((c) => {
    const th = h("th", { class: [c.num ? "num" : "", c.sort ? "sortable" : ""].join(" ").trim() },
      c.title);
    if (c.sort && opts.onSort) {
      th.addEventListener("click", () => opts.onSort(c.sort));
      if (opts.sorted === c.sort) th.append(" ▲");
      if (opts.sorted === `-${c.sort}`) th.append(" ▼");
    }
    return th;
  }));
  const body = rows.length
    ? rows.map((r) => h("tr", opts.rowAttrs ? opts.rowAttrs(r) : {},
      columns.map((c) => h("td", { class: c.num ? "num" : c.cls || "" }, c.cell(r)))))
    : [h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, opts.empty || "none"))];
  return h("table", opts.attrs || {}, h("thead", {}, head), h("tbody", {}, body));
}

// A dialog; resolves true when confirmed. With `typed`, the confirm button stays disabled
// until that exact text is typed.
export function confirmDialog(title, text, { typed, action = "Confirm", danger = true } = {}) {
  return new Promise((resolve) => {
    const input = typed ? h("input", { "aria-label": "type to confirm", id: "confirm-input" }) : null;
    const ok = h("button", { class: danger ? "danger" : "primary", id: "confirm-ok" }, action);
    const done = (v) => { back.remove(); resolve(v); };
    ok.addEventListener("click", () => done(true));
    const cancel = h("button", { onclick: () => done(false) }, "Cancel");
    if (input) {
      ok.disabled = true;
      input.addEventListener("input", () => { ok.disabled = input.value !== typed; });
    }
    const back = h("div", { class: "modal-back" },
      h("div", { class: "modal", role: "dialog", "aria-label": title },
        h("h2", {}, title), h("p", {}, text),
        input ? h("p", {}, "Type ", h("b", {}, typed), " to confirm:") : null, input,
        h("div", { class: "actions" }, cancel, ok)));
    document.body.append(back);
    (input || ok).focus();
  });
}

export function fmtNum(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: 2 });
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  if (n < 0) return String(n);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = Number(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 0) return "unlimited";
  const s = ms / 1000;
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

export function fmtTime(ms) {
  if (!ms && ms !== 0) return "–";
  return new Date(ms).toISOString().replace("T", " ").replace("Z", "");
}

export function fmtDuration(s) {
  s = Math.floor(s);
  const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60), ss = s % 60;
  return (d ? `${d}d ` : "") + (d || hh ? `${hh}h ` : "") + `${m}m ${ss}s`;
}

export function download(name, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

export function link(href, text) {
  return h("a", { href }, text);
}
