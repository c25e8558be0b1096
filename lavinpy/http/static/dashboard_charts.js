// lavinpy dashboard: the overview and the charts. The points come from the samples the broker keeps
// (RabbitMQ's lengths_age/msg_rates_age query parameters), so a chart is full as soon as a page
// loads; nothing is remembered in the browser between polls.
"use strict";

const CHART_SECONDS = 600;  // ten minutes: what the broker keeps
const CHART_INCR = 5;
const SAMPLE_QUERY = `lengths_age=${CHART_SECONDS}&lengths_incr=${CHART_INCR}` +
  `&msg_rates_age=${CHART_SECONDS}&msg_rates_incr=${CHART_INCR}`;
const RATE_SERIES = [
  ["publish", "Publish", "#1f77b4"],
  ["deliver_get", "Deliver / get", "#2ca02c"],
  ["ack", "Ack", "#d62728"],
];
const DEPTH_SERIES = [
  ["messages_ready", "Ready", "#1f77b4"],
  ["messages_unacknowledged", "Unacked", "#2ca02c"],
];

function fmtCount(n) { return String(Math.round(n || 0)); }

// [[timestamp, value], ...] oldest first, from RabbitMQ's samples (newest first).
function samplePoints(details) {
  return ((details && details.samples) || []).map((s) => [s.timestamp, s.sample]).reverse();
}

// A rate series from cumulative counts: the change between neighbouring samples per second.
function ratePoints(details) {
  const pts = samplePoints(details);
  const out = [];
  for (let i = 1; i < pts.length; i++) {
    const dt = (pts[i][0] - pts[i - 1][0]) / 1000;
    if (dt > 0) out.push([pts[i][0], Math.max(0, (pts[i][1] - pts[i - 1][1]) / dt)]);
  }
  return out;
}

// series: [[label, color, points]]; the x axis is the last CHART_SECONDS up to the newest point.
// The canvas carries data-points (points drawn) and data-max (highest value) for anyone checking it.
function drawSeries(canvas, series, fmt) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, left = 56, bottom = 20, top = 10;
  ctx.clearRect(0, 0, W, H);
  const all = series.flatMap(([, , pts]) => pts);
  const max = Math.max(1, ...all.map((p) => p[1]));
  const end = all.length ? Math.max(...all.map((p) => p[0])) : Date.now();
  const start = end - CHART_SECONDS * 1000;
  canvas.dataset.points = String(all.length);
  canvas.dataset.max = String(all.length ? Math.max(...all.map((p) => p[1])) : 0);
  ctx.strokeStyle = "#ccc"; ctx.fillStyle = "#555"; ctx.font = "11px sans-serif"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = top + (H - top - bottom) * (1 - i / 4);
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(W, y); ctx.stroke();
    ctx.fillText(fmt(max * i / 4), 2, y + 4);
  }
  ctx.fillText(`last ${CHART_SECONDS / 60} min`, left, H - 4);
  const x = (t) => left + (W - left) * ((t - start) / (end - start));
  const y = (v) => top + (H - top - bottom) * (1 - v / max);
  for (const [, color, pts] of series) {
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
    pts.forEach(([t, v], i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, x(t), y(v)));
    if (pts.length === 1) ctx.arc(x(pts[0][0]), y(pts[0][1]), 2, 0, 2 * Math.PI);  // one sample: a dot
    ctx.stroke();
  }
}

function legendOf(series, idPrefix) {
  return h("div", { className: "legend" }, series.map(([key, label], i) =>
    h("span", {}, h("span", { className: "swatch c" + i }), label + " ", h("b", { id: idPrefix + key }, "-"))));
}

// A queue's depth over the last minutes: ready and unacked, from the queue's own samples.
function depthChart() {
  const canvas = h("canvas", { id: "depth-chart", width: 900, height: 180 });
  const el = h("div", { className: "card" }, h("h3", {}, "Queue depth"), canvas, legendOf(DEPTH_SERIES, "depth-"));
  function draw(q) {
    drawSeries(canvas, DEPTH_SERIES.map(([key, , color]) => [key, color, samplePoints(q[key + "_details"])]), fmtCount);
    for (const [key] of DEPTH_SERIES) { const b = $("#depth-" + key, el); if (b) b.textContent = fmtCount(q[key]); }
  }
  return { el, draw };
}

PAGES.overview = () => {
  const totals = h("div", { className: "totals", id: "totals" });
  const rateCanvas = h("canvas", { id: "rate-chart", width: 900, height: 220 });
  const depthCanvas = h("canvas", { id: "overview-depth-chart", width: 900, height: 160 });
  main().append(h("h2", {}, "Overview"), totals,
    h("div", { className: "card" }, h("h3", {}, "Message rates"), rateCanvas, legendOf(RATE_SERIES, "rate-")),
    h("div", { className: "card" }, h("h3", {}, "Queued messages"), depthCanvas, legendOf(DEPTH_SERIES, "queued-")));
  poll(async () => {
    const o = await act(() => api("GET", "overview?" + SAMPLE_QUERY));
    if (!o || !document.body.contains(rateCanvas)) return;
    const ms = o.message_stats || {};
    const t = (label, id, value) => h("div", { className: "total" }, label, h("b", { id }, value ?? 0));
    const qt = o.queue_totals || {}, ot = o.object_totals || {};
    totals.replaceChildren(
      t("Messages", "total-messages", qt.messages), t("Ready", "total-ready", qt.messages_ready),
      t("Unacked", "total-unacked", qt.messages_unacknowledged), t("Published", "total-publish", ms.publish),
      t("Delivered", "total-deliver", ms.deliver_get), t("Acked", "total-ack", ms.ack),
      t("Queues", "total-queues", ot.queues), t("Exchanges", "total-exchanges", ot.exchanges),
      t("Connections", "total-connections", ot.connections), t("Channels", "total-channels", ot.channels),
      t("Consumers", "total-consumers", ot.consumers));
    for (const [k] of RATE_SERIES) $("#rate-" + k).textContent = fmtRate(get(ms, k + "_details.rate"));
    for (const [k] of DEPTH_SERIES) $("#queued-" + k).textContent = fmtCount(qt[k]);
    drawSeries(rateCanvas, RATE_SERIES.map(([k, , color]) => [k, color, ratePoints(ms[k + "_details"])]), fmtRate);
    drawSeries(depthCanvas, DEPTH_SERIES.map(([k, , color]) => [k, color, samplePoints(qt[k + "_details"])]), fmtCount);
  });
};
