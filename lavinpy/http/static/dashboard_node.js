// lavinpy dashboard: the node page (memory, disk, file descriptors, uptime, version, listeners, alarms,
// the alarm thresholds) and the alarm banner shown on every page while a resource alarm is on.
"use strict";

let alarmTimer = null;

function fmtBytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = n, i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i ? v.toFixed(1) : String(v)) + " " + units[i];
}

function fmtUptime(ms) {
  let s = Math.floor((ms || 0) / 1000);
  const d = Math.floor(s / 86400); s -= d * 86400;
  const hr = Math.floor(s / 3600); s -= hr * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  return (d ? d + "d " : "") + (d || hr ? hr + "h " : "") + m + "m " + s + "s";
}

// The node entry (monitoring and administrator users: the others get no banner) names the alarms.
// Not the health check: its 503 would be logged by the browser as a failed load on every poll.
async function fetchAlarms() {
  const nodes = await api("GET", "nodes?columns=name,mem_alarm,disk_free_alarm");
  return nodes.flatMap((n) => [n.mem_alarm && "memory", n.disk_free_alarm && "disk"].filter(Boolean));
}

async function updateAlarmBanner() {
  const banner = $("#alarm-banner");
  let alarms = null;
  try { alarms = await fetchAlarms(); } catch (e) { alarms = null; }
  if (!alarms || !alarms.length) { banner.hidden = true; banner.replaceChildren(); return; }
  const what = [...new Set(alarms)].map((r) => r === "disk" ? "free disk space below its limit" : "memory above its high watermark");
  banner.replaceChildren(h("b", {}, "Resource alarm: "), what.join("; ") + ". Publishers are blocked. ",
    link("#/node", "Node details"));
  banner.dataset.alarms = alarms.join(",");
  banner.hidden = false;
}

function startAlarmBanner(tags) {
  stopAlarmBanner();
  if (!tags.includes("administrator") && !tags.includes("monitoring")) return;
  updateAlarmBanner();
  alarmTimer = setInterval(updateAlarmBanner, POLL_MS);
}

function stopAlarmBanner() {
  if (alarmTimer) { clearInterval(alarmTimer); alarmTimer = null; }
  const banner = $("#alarm-banner");
  if (banner) banner.hidden = true;
}

// A used/limit bar, full at the limit. Disk is drawn as its limit against what is free, so for both
// a fuller bar is closer to the alarm.
function gauge(id, used, limit, alarm, label) {
  const share = limit ? Math.min(1, used / limit) : 0;
  const fill = h("div", { className: "gauge-fill" });
  fill.style.width = (share * 100).toFixed(1) + "%";  // through the CSSOM: the page's CSP refuses style attributes
  return h("div", { className: "gauge" + (alarm ? " alarm" : ""), id },
    h("div", { className: "gauge-label" }, label), h("div", { className: "gauge-bar" }, fill));
}

PAGES.node = () => {
  const facts = h("table", { id: "node-facts" });
  const gauges = h("div", { id: "node-gauges" });
  const listeners = h("table", { id: "node-listeners" });
  const alarms = h("div", { id: "node-alarms" });
  const thresholds = h("form", { className: "inline card", id: "threshold-form" }, h("b", {}, "Alarm thresholds"),
    h("label", {}, "Memory high watermark", h("input", { name: "memory", id: "memory-watermark", placeholder: "0.4 or 512MiB" })),
    h("label", {}, "Disk free limit", h("input", { name: "disk", id: "disk-free-limit", placeholder: "50MB" })),
    h("button", { type: "submit" }, "Set"));
  main().append(h("h2", {}, "Node ", h("small", { id: "node-name" }, "")), alarms, gauges,
    h("div", { className: "card" }, facts), h("div", { className: "card" }, h("h3", {}, "Listeners"), listeners), thresholds);
  let nodeName = "";
  thresholds.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const d = formData(thresholds);
    act(async () => {
      const path = `nodes/${enc(nodeName)}/`;
      if (d.memory) {
        // a number up to 1 is a fraction of RAM, as rabbitmqctl takes it; anything else a size
        const fraction = Number(d.memory);
        await api("PUT", path + "memory_high_watermark", !isNaN(fraction) && fraction <= 1 ? { fraction } : { absolute: d.memory });
      }
      if (d.disk) await api("PUT", path + "disk_free_limit", { bytes: d.disk });
      await load();
      updateAlarmBanner();
    }, "Thresholds set");
  });
  async function load() {
    const [nodes, o] = await Promise.all([act(() => api("GET", "nodes")), act(() => api("GET", "overview"))]);
    if (!nodes || !o || !document.body.contains(facts)) return;
    const n = nodes.find((x) => x.self !== false) || nodes[0];
    nodeName = n.name;
    $("#node-name").textContent = n.name;
    const row = (k, v, id) => h("tr", {}, h("th", {}, k), h("td", { id }, v ?? ""));
    const app = (n.applications || [])[0] || {};
    facts.replaceChildren(
      row("Version", `${o.product_name} ${o.product_version} (API of RabbitMQ ${o.rabbitmq_version})`, "node-version"),
      row("Uptime", fmtUptime(n.uptime), "node-uptime"),
      row("Memory used", `${fmtBytes(n.mem_used)} of ${fmtBytes(n.mem_limit)} high watermark`, "node-memory"),
      row("Disk free", `${fmtBytes(n.disk_free)} (limit ${fmtBytes(n.disk_free_limit)})`, "node-disk"),
      row("File descriptors", `${n.fd_used} of ${n.fd_total}`, "node-fds"),
      row("Sockets", n.sockets_used, "node-sockets"), row("Processors", n.processors, "node-processors"),
      row("Application", `${app.name || ""} ${app.version || ""}`.trim(), "node-application"));
    gauges.replaceChildren(
      gauge("gauge-memory", n.mem_used, n.mem_limit, n.mem_alarm, `Memory ${fmtBytes(n.mem_used)} / ${fmtBytes(n.mem_limit)}`),
      gauge("gauge-disk", n.disk_free_limit, n.disk_free, n.disk_free_alarm,
        `Disk limit ${fmtBytes(n.disk_free_limit)} / ${fmtBytes(n.disk_free)} free`),
      gauge("gauge-fds", n.fd_used, n.fd_total, false, `File descriptors ${n.fd_used} / ${n.fd_total}`));
    listeners.replaceChildren(h("tr", {}, ["Protocol", "Address", "Port"].map((t) => h("th", {}, t))),
      ...(o.listeners || []).map((l) => h("tr", {}, h("td", {}, l.protocol), h("td", {}, l.ip_address), h("td", {}, l.port))));
    const raised = [n.mem_alarm && "memory", n.disk_free_alarm && "disk"].filter(Boolean);
    alarms.className = "card " + (raised.length ? "alarm" : "ok");
    alarms.dataset.alarms = raised.join(",");
    alarms.textContent = raised.length ? "Alarms in effect: " + raised.join(", ") : "No alarms";
    const mem = $("#memory-watermark"), disk = $("#disk-free-limit");
    if (document.activeElement !== mem && !mem.value) mem.placeholder = `now ${fmtBytes(n.mem_limit)}`;
    if (document.activeElement !== disk && !disk.value) disk.placeholder = `now ${n.disk_free_limit} bytes`;
  }
  poll(load);
};
