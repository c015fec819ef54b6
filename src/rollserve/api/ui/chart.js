// A small inline SVG line chart of one series over time (no library).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  return node;
}

class LineChart {
  // title: shown above; unit: after the numbers; points kept: the last `keep`.
  constructor(title, unit, keep) {
    this.unit = unit;
    this.keep = keep || 300;
    this.points = []; // [seconds, value]
    this.width = 420;
    this.height = 120;
    this.value = h("span", { class: "chart-value" }, "–");
    this.svg = svg("svg", { viewBox: `0 0 ${this.width} ${this.height}`, class: "chart-svg",
                            role: "img", "aria-label": title });
    this.node = h("div", { class: "chart" }, h("div", { class: "chart-title" }, title, " ", this.value),
                  this.svg);
  }

  add(t, value) {
    this.points.push([t, value]);
    if (this.points.length > this.keep) this.points.shift();
    this.draw();
  }

  draw() {
    const { width, height, points } = this;
    this.svg.replaceChildren();
    const pad = 4;
    const top = Math.max(1e-9, ...points.map((p) => p[1]));
    this.value.textContent = points.length ? `${fmt(points[points.length - 1][1], 1)} ${this.unit}` : "–";
    this.svg.append(svg("line", { x1: 0, y1: height - pad, x2: width, y2: height - pad, class: "axis" }));
    const label = svg("text", { x: 4, y: 12, class: "chart-label" });
    label.textContent = `max ${fmt(top, 1)}`;
    this.svg.append(label);
    if (points.length < 2) return;
    const t0 = points[0][0];
    const span = Math.max(1e-9, points[points.length - 1][0] - t0);
    const coords = points.map(([t, v]) => {
      const x = ((t - t0) / span) * width;
      const y = height - pad - (v / top) * (height - 2 * pad - 12);
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    });
    this.svg.append(svg("polyline", { points: coords.join(" "), class: "line" }));
  }
}
