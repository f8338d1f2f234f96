// A line chart as inline SVG: [[ts_seconds, value], ...] over the time span of the points,
// with the latest value, min/max gridlines and time labels. No library.

const NS = "http://www.w3.org/2000/svg";
const W = 400, H = 160, L = 48, R = 8, T = 8, B = 20;

function el(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function clock(ts) {
  return new Date(ts * 1000).toISOString().slice(11, 19);
}

export function lineChart(title, points, fmt = (v) => String(v)) {
  const box = document.createElement("div");
  box.className = "card chart";
  const head = document.createElement("div");
  head.className = "title";
  const last = points && points.length ? points[points.length - 1][1] : null;
  head.textContent = last === null ? title : `${title}: ${fmt(last)}`;
  box.append(head);
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title,
    preserveAspectRatio: "none" });
  box.append(svg);
  if (!points || points.length < 2) {
    svg.append(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" },
      points && points.length ? "one sample so far" : "no samples yet"));
    return box;
  }
  const t0 = points[0][0], t1 = points[points.length - 1][0];
  let lo = Math.min(...points.map((p) => p[1])), hi = Math.max(...points.map((p) => p[1]));
  lo = Math.min(lo, 0);
  if (hi === lo) hi = lo + 1;
  const x = (t) => L + ((t - t0) / (t1 - t0 || 1)) * (W - L - R);
  const y = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
  for (const v of [lo, (lo + hi) / 2, hi]) {
    svg.append(el("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
    svg.append(el("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" }, fmt(v)));
  }
  svg.append(el("text", { x: L, y: H - 4 }, clock(t0)));
  svg.append(el("text", { x: W - R, y: H - 4, "text-anchor": "end" }, clock(t1)));
  const d = points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`);
  svg.append(el("path", { d: d.join(""), class: "line" }));
  return box;
}
