// Bar charts drawn as inline SVG from the page's own JSON: no library, no CDN. The SVG scales with its
// container (viewBox), so the same drawing fits a wide screen and a 400 px phone.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== null) node.textContent = text;
  return node;
}

// A round step for the y axis: 1, 2 or 5 times a power of ten, giving at most about four grid lines.
function niceStep(max) {
  const raw = Math.max(max, 1) / 4;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  return Math.max(1, step);
}

// buckets: [{start, ...counts}], series: [{key, label, cls}] stacked bottom-up.
function drawStackedBars(container, buckets, series) {
  const width = 720, height = 190, left = 38, right = 8, top = 10, bottom = 26;
  const plotW = width - left - right, plotH = height - top - bottom;
  const totals = buckets.map((b) => series.reduce((sum, s) => sum + (b[s.key] || 0), 0));
  const step = niceStep(Math.max(0, ...totals));
  const yMax = Math.max(step, Math.ceil(Math.max(0, ...totals) / step) * step);
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart-svg" });
  for (let value = 0; value <= yMax; value += step) {
    const y = top + plotH - (value / yMax) * plotH;
    root.append(svg("line", { x1: left, x2: width - right, y1: y, y2: y, class: "grid" }));
    root.append(svg("text", { x: left - 6, y: y + 4, class: "axis", "text-anchor": "end" }, String(value)));
  }
  const slot = plotW / Math.max(buckets.length, 1);
  buckets.forEach((bucket, i) => {
    const x = left + i * slot;
    const start = new Date(bucket.start);
    const hour = start.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
    let base = top + plotH;
    for (const s of series) {
      const value = bucket[s.key] || 0;
      if (!value) continue;
      const h = (value / yMax) * plotH;
      base -= h;
      const bar = svg("rect", { x: x + 1.5, y: base, width: Math.max(slot - 3, 1), height: h, class: s.cls });
      bar.setAttribute("data-hour", bucket.start);
      bar.append(svg("title", {}, `${hour}: ${value} ${s.label}`));
      root.append(bar);
    }
    const last = i === buckets.length - 1;
    if (i % 6 === 0 || last) {
      // The last label ends at the plot's edge rather than centring past it.
      const anchor = last ? { x: x + slot, "text-anchor": "end" } : { x: x + slot / 2, "text-anchor": "middle" };
      root.append(svg("text", { ...anchor, y: height - 8, class: "axis" }, hour));
    }
  });
  root.append(svg("line", { x1: left, x2: width - right, y1: top + plotH, y2: top + plotH, class: "baseline" }));
  container.replaceChildren(root);
}

window.engramCharts = { drawStackedBars };
