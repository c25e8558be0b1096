// lavinpy dashboard: plain JavaScript over the management HTTP API (no framework, no build step).
"use strict";

const AUTH_KEY = "lavinpy.auth";
const TOKEN_KEY = "lavinpy.token";  // an access token from single sign-on (dashboard_sso.js), sent as Bearer
const loggedIn = () => sessionStorage.getItem(AUTH_KEY) || sessionStorage.getItem(TOKEN_KEY);
const POLL_MS = 5000;
let pollTimer = null;

// ---- DOM helpers: text always goes in as text nodes, never as HTML.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "className") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}
const $ = (sel, root = document) => root.querySelector(sel);
const main = () => $("#main");

function flash(text, ok = false) {
  const f = $("#flash");
  f.textContent = text;
  f.className = ok ? "ok" : "";
  f.hidden = !text;
}

// ---- API access: basic credentials from sessionStorage, errors as RabbitMQ's {error, reason}.
class ApiError extends Error {}

async function api(method, path, body, headers = {}) {
  const auth = sessionStorage.getItem(AUTH_KEY), token = sessionStorage.getItem(TOKEN_KEY);
  const init = { method, credentials: "omit", headers: { ...headers } };
  if (token) init.headers.Authorization = "Bearer " + token;
  else if (auth) init.headers.Authorization = "Basic " + auth;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  const resp = await fetch("/api/" + path, init);
  const text = await resp.text();
  const data = text ? JSON.parse(text) : null;
  // 401 is both a refusal ("not_authorised": shown) and failed credentials (back to the login form).
  if (resp.status === 401 && !(data && data.error === "not_authorised")) {
    if (path !== "whoami") logout("Session expired: log in again");
    throw new ApiError("401");
  }
  if (!resp.ok) throw new ApiError((data && (data.reason || data.error)) || resp.status + " " + resp.statusText);
  return data;
}

// Runs an action from a button or form; shows its error (or a success text) in the flash line.
async function act(fn, okText) {
  if (okText) flash("");
  try {
    const result = await fn();
    if (okText) flash(typeof okText === "function" ? okText(result) : okText, true);
    return result;
  } catch (e) {
    if (!(e instanceof ApiError && e.message === "401")) flash(e.message);
    return undefined;
  }
}

const enc = encodeURIComponent;
const exchangePath = (name) => name === "" ? "amq.default" : name;

// ---- formatting
function fmtRate(r) { return (r || 0).toFixed(r >= 100 ? 0 : 1) + "/s"; }
function fmtAge(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return ms + " ms";
  const s = ms / 1000;
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}
function get(obj, dotted) { return dotted.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj); }
function formData(form) { return Object.fromEntries(new FormData(form).entries()); }
function parseJsonField(text, what) {
  if (!text || !text.trim()) return {};
  try { return JSON.parse(text); } catch (e) { throw new ApiError(what + " is not valid JSON: " + e.message); }
}

// ---- login
function showLogin(message) {
  $("#nav").hidden = true;
  $("#logout").hidden = true;
  $("#whoami").textContent = "";
  const form = h("form", { id: "login", className: "card" },
    h("h2", {}, "Log in"),
    h("label", {}, "Username ", h("input", { name: "username", autocomplete: "username", required: true })),
    h("label", {}, "Password ", h("input", { name: "password", type: "password", autocomplete: "current-password" })),
    h("button", { type: "submit" }, "Log in"));
  form.addEventListener("submit", onLogin);
  main().replaceChildren(form);
  offerSso(form);  // dashboard_sso.js: a "Sign in with SSO" button when the broker has it on
  if (message) flash(message);
}

async function onLogin(ev) {
  ev.preventDefault();
  const { username, password } = formData(ev.target);
  // btoa takes Latin-1 only: encode UTF-8 first so any password works.
  const bytes = new TextEncoder().encode(username + ":" + password);
  sessionStorage.setItem(AUTH_KEY, btoa(String.fromCharCode(...bytes)));
  try {
    await api("GET", "whoami");
  } catch (e) {
    sessionStorage.removeItem(AUTH_KEY);
    flash(e.message === "401" ? "Login failed" : "Login failed: " + e.message);
    return;
  }
  flash("");
  start();
}

function logout(message) {
  sessionStorage.removeItem(AUTH_KEY);
  sessionStorage.removeItem(TOKEN_KEY);
  stopPolling();
  stopAlarmBanner();
  showLogin(message);
}

async function start() {
  let me;
  try { me = await api("GET", "whoami"); } catch (e) { showLogin(); return; }
  const tags = Array.isArray(me.tags) ? me.tags.join(",") : me.tags;
  $("#whoami").textContent = me.name + (tags ? " (" + tags + ")" : "");
  $("#nav").hidden = false;
  $("#logout").hidden = false;
  startAlarmBanner(Array.isArray(me.tags) ? me.tags : String(me.tags || "").split(","));  // dashboard_node.js: on every page
  if (!location.hash || location.hash === "#") location.hash = "#/overview";
  else route();
}

// ---- routing: #/page[/vhost/name]
const PAGES = {};

function route() {
  if (!loggedIn()) { showLogin(); return; }
  stopPolling();
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const page = PAGES[parts[0]] || PAGES.overview;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.getAttribute("href") === "#/" + parts[0]);
  // Everything the last page showed goes with it, messages read by peek or get included (they are
  // kept in no variable: a page's elements are its only state).
  main().replaceChildren();
  page(...parts.slice(1));
}

function stopPolling() { if (pollTimer) { clearInterval(pollTimer); pollTimer = null; } }
function poll(fn) { fn(); pollTimer = setInterval(fn, POLL_MS); }

// The overview and its charts are in dashboard_charts.js, the node page and alarm banner in dashboard_node.js.

// ---- paged, sortable lists: page/page_size/sort/sort_reverse/name go to the API, so a page of
// a list of 10,000 objects costs one small reply.
function pagedList({ id, path, columns, rowActions, defaultSort = "name" }) {
  const state = { page: 1, page_size: 50, sort: defaultSort, sort_reverse: false, name: "" };
  const table = h("table", { id });
  const info = h("span", { className: "page-info" });
  const filter = h("input", { placeholder: "Filter by name", className: "filter" });
  const size = h("select", {}, [20, 50, 100, 500].map((n) => h("option", { value: n, selected: n === 50 }, n)));
  const prev = h("button", { type: "button", className: "prev" }, "\u2190 Prev");
  const next = h("button", { type: "button", className: "next" }, "Next \u2192");
  let pageCount = 1;
  const cols = columns.flatMap((c) => c.fields || (c.field ? [c.field] : []));
  async function load() {
    const q = new URLSearchParams({ page: state.page, page_size: state.page_size, sort: state.sort,
      sort_reverse: state.sort_reverse, columns: cols.join(",") });
    if (state.name) q.set("name", state.name);
    const data = await act(() => api("GET", path + "?" + q));
    if (!data) return;
    pageCount = Math.max(1, data.page_count);
    if (state.page > pageCount) { state.page = pageCount; return load(); }
    info.textContent = `page ${data.page} of ${pageCount} \u00b7 ${data.filtered_count} of ${data.total_count}`;
    prev.disabled = state.page <= 1; next.disabled = state.page >= pageCount;
    const head = h("tr", {}, columns.map((c) => {
      const th = h("th", { className: (c.num ? "num " : "") + (c.sort ? "sortable" : ""), "data-sort": c.sort }, c.label);
      if (c.sort === state.sort) th.classList.add(state.sort_reverse ? "sorted-desc" : "sorted-asc");
      if (c.sort) th.addEventListener("click", () => {
        state.sort_reverse = state.sort === c.sort ? !state.sort_reverse : false;
        state.sort = c.sort; state.page = 1; load();
      });
      return th;
    }), rowActions ? h("th", {}, "") : null);
    const rows = data.items.map((item) => h("tr", {}, columns.map((c) => {
      const value = c.render ? c.render(item) : get(item, c.field);
      return h("td", { className: c.num ? "num" : "" }, value ?? "");
    }), rowActions ? h("td", {}, rowActions(item, load)) : null));
    table.replaceChildren(h("thead", {}, head), h("tbody", {}, rows));
  }
  let filterTimer;
  filter.addEventListener("input", () => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(() => { state.name = filter.value; state.page = 1; load(); }, 300);
  });
  size.addEventListener("change", () => { state.page_size = +size.value; state.page = 1; load(); });
  prev.addEventListener("click", () => { state.page--; load(); });
  next.addEventListener("click", () => { state.page++; load(); });
  const el = h("div", {}, h("div", { className: "pager" }, filter, prev, info, next, h("label", {}, "per page", size)), table);
  return { el, load };
}

const link = (hash, text) => h("a", { href: hash }, text);
const objectHash = (page, vhost, name) => `#/${page}/${enc(vhost)}/${enc(name)}`;
const rateCol = (label, key) => ({ label, field: `message_stats.${key}_details.rate`, num: true,
  sort: `message_stats.${key}_details.rate`, render: (q) => fmtRate(get(q, `message_stats.${key}_details.rate`)) });

// ---- queues
PAGES.queues = () => {
  const list = pagedList({ id: "queues", path: "queues", columns: [
    { label: "Vhost", field: "vhost", sort: "vhost" },
    { label: "Name", field: "name", sort: "name", render: (q) => link(objectHash("queue", q.vhost, q.name), q.name) },
    { label: "Type", field: "type" },
    { label: "Ready", field: "messages_ready", num: true, sort: "messages_ready" },
    { label: "Unacked", field: "messages_unacknowledged", num: true, sort: "messages_unacknowledged" },
    { label: "Total", field: "messages", num: true, sort: "messages" },
    { label: "Consumers", field: "consumers", num: true, sort: "consumers" },
    { label: "Head age", field: "head_message_age_ms", num: true, sort: "head_message_age_ms",
      render: (q) => fmtAge(q.head_message_age_ms) },
    rateCol("Publish", "publish"), rateCol("Deliver", "deliver_get"), rateCol("Ack", "ack"),
  ] });
  const form = h("form", { className: "inline card", id: "declare-queue" },
    h("b", {}, "Add queue"), vhostSelect(),
    h("label", {}, "Name", h("input", { name: "name", required: true })),
    h("label", {}, h("input", { type: "checkbox", name: "durable", checked: true }), "durable"),
    h("label", {}, "Arguments (JSON)", h("input", { name: "arguments", placeholder: '{"x-message-ttl": 60000}' })),
    h("button", { type: "submit" }, "Add queue"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const d = formData(form);
    act(async () => {
      await api("PUT", `queues/${enc(d.vhost)}/${enc(d.name)}`,
        { durable: d.durable === "on", auto_delete: false, arguments: parseJsonField(d.arguments, "Arguments") });
      list.load();
    }, `Queue '${d.name}' declared`);
  });
  main().append(h("h2", {}, "Queues"), list.el, form);
  poll(list.load);
};

function vhostSelect(name = "vhost") {
  const sel = h("select", { name }, h("option", { value: "/" }, "/"));
  api("GET", "vhosts").then((vs) => sel.replaceChildren(...vs.map((v) => h("option", { value: v.name }, v.name))))
    .catch(() => {});
  return h("label", {}, "Vhost", sel);
}

function messagesTable(messages) {
  return h("table", { className: "messages" }, h("thead", {}, h("tr", {}, ["#", "Routing key", "Exchange", "Redelivered",
    "Properties", "Payload"].map((t) => h("th", {}, t)))),
  h("tbody", {}, messages.map((m, i) => h("tr", {}, h("td", {}, i + 1), h("td", {}, m.routing_key), h("td", {}, m.exchange),
    h("td", {}, m.delayed_until ? `${m.redelivered} (retry due ${new Date(m.delayed_until).toISOString()})` : String(m.redelivered)),
    h("td", {}, h("pre", {}, JSON.stringify(m.properties))),
    h("td", { className: "payload" }, h("pre", {}, m.payload + (m.payload_encoding === "base64" ? " (base64)" : "")))))));
}

function publishForm(vhost, exchange, routingKey, onDone) {
  const form = h("form", { className: "card publish-form" }, h("h3", {}, "Publish message"),
    h("label", {}, "Routing key", h("input", { name: "routing_key", value: routingKey })),
    h("label", {}, "Delivery mode", h("select", { name: "delivery_mode" },
      h("option", { value: "1" }, "1 (transient)"), h("option", { value: "2" }, "2 (persistent)"))),
    h("label", {}, "Headers (JSON)", h("input", { name: "headers", placeholder: '{"k": "v"}' })),
    h("textarea", { name: "payload", placeholder: "Payload" }),
    h("button", { type: "submit" }, "Publish"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const d = formData(form);
    act(async () => {
      const properties = { delivery_mode: +d.delivery_mode };
      const headers = parseJsonField(d.headers, "Headers");
      if (Object.keys(headers).length) properties.headers = headers;
      const r = await api("POST", `exchanges/${enc(vhost)}/${enc(exchangePath(exchange))}/publish`,
        { routing_key: d.routing_key, payload: d.payload, payload_encoding: "string", properties });
      if (onDone) onDone();
      return r;
    }, (r) => r.routed ? "Message published" : "Message published but not routed");
  });
  return form;
}

PAGES.queue = (vhost, name) => {
  const qpath = `queues/${enc(vhost)}/${enc(name)}`;
  const details = h("table", { id: "queue-details" });
  const depth = depthChart();  // dashboard_charts.js: drawn from the broker's samples
  const bindings = h("table", { id: "queue-bindings" });
  const consumers = h("table", { id: "queue-consumers" });
  const results = h("div", { id: "messages" });
  async function load() {
    const q = await act(() => api("GET", qpath + "?" + SAMPLE_QUERY));
    if (!q) return;
    depth.draw(q);
    const row = (k, v) => h("tr", {}, h("th", {}, k), h("td", { "data-field": k }, v ?? ""));
    details.replaceChildren(row("messages", q.messages), row("messages_ready", q.messages_ready),
      row("messages_unacknowledged", q.messages_unacknowledged), row("consumers", q.consumers),
      row("head message age", fmtAge(q.head_message_age_ms)), row("type", q.type), row("durable", String(q.durable)),
      row("policy", q.policy), row("operator_policy", q.operator_policy),
      row("effective_policy_definition", JSON.stringify(q.effective_policy_definition || {})),
      row("arguments", JSON.stringify(q.arguments)),
      row("publish rate", fmtRate(get(q, "message_stats.publish_details.rate"))),
      row("deliver rate", fmtRate(get(q, "message_stats.deliver_get_details.rate"))),
      ...(q.messages_delayed !== undefined ? [row("messages_delayed (retries waiting)", q.messages_delayed),
        row("delayed retries", get(q, "message_stats.delayed_retries"))] : []),
      ...(q.deduplication ? [row("duplicates dropped", q.deduplication.duplicates),
        row("deduplication cache", `${q.deduplication.cache_entries} / ${q.deduplication.cache_size}`)] : []),
      ...(q.type === "quorum" ? [row("leader", q.leader), row("members", (q.members || []).join(", "))] : []));
    const bs = await act(() => api("GET", qpath + "/bindings")) || [];
    bindings.replaceChildren(h("tr", {}, h("th", {}, "From exchange"), h("th", {}, "Routing key"), h("th", {}, "Arguments"), h("th", {})),
      ...bs.map((b) => h("tr", {}, h("td", {}, b.source || "(default)"), h("td", {}, b.routing_key),
        h("td", {}, JSON.stringify(b.arguments)), h("td", {}, b.source ? h("button", { type: "button", onclick: () => act(async () => {
          await api("DELETE", `bindings/${enc(vhost)}/e/${enc(b.source)}/q/${enc(name)}/${enc(b.properties_key)}`); load();
        }, "Unbound") }, "Unbind") : ""))));
    const cs = await act(() => api("GET", `consumers/${enc(vhost)}`)) || [];
    consumers.replaceChildren(h("tr", {}, ["Consumer tag", "Channel", "Ack required", "Prefetch"].map((t) => h("th", {}, t))),
      ...cs.filter((c) => c.queue && c.queue.name === name).map((c) => h("tr", {}, h("td", {}, c.consumer_tag),
        h("td", {}, get(c, "channel_details.name")), h("td", {}, String(c.ack_required)), h("td", {}, c.prefetch_count))));
  }
  const countInput = (id) => h("input", { name: "count", type: "number", min: 1, value: 1, id, className: "count" });
  const peekCount = countInput("peek-count"), getCount = countInput("get-count"), replayCount = countInput("replay-count");
  const ackmode = h("select", { name: "ackmode", id: "get-ackmode" }, ["ack_requeue_true", "ack_requeue_false",
    "reject_requeue_true", "reject_requeue_false"].map((m) => h("option", { value: m }, m)));
  const button = (id, text, onclick, className) => h("button", { type: "button", id, onclick, className }, text);
  const bindForm = h("form", { className: "inline" }, h("b", {}, "Bind from exchange"),
    h("input", { name: "source", required: true, placeholder: "exchange" }), h("input", { name: "routing_key", placeholder: "routing key" }),
    h("button", { type: "submit" }, "Bind"));
  bindForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const d = formData(bindForm);
    act(async () => { await api("POST", `bindings/${enc(vhost)}/e/${enc(d.source)}/q/${enc(name)}`, { routing_key: d.routing_key, arguments: {} }); load(); }, "Bound");
  });
  main().append(h("h2", {}, `Queue ${name} `, h("small", {}, `in vhost ${vhost}`)),
    h("div", { className: "card" }, details),
    depth.el,
    h("div", { className: "card" }, h("h3", {}, "Bindings"), bindings, bindForm),
    h("div", { className: "card" }, h("h3", {}, "Consumers"), consumers),
    h("div", { className: "card" }, h("h3", {}, "Messages"),
      h("div", { className: "inline" },
        h("label", {}, "Peek", peekCount), button("peek", "Peek", () => act(async () => {
          results.replaceChildren(messagesTable(await api("GET", `${qpath}/peek?count=${+peekCount.value || 1}`)));
        })),
        h("label", {}, "Get", getCount), ackmode, button("get", "Get", () => act(async () => {
          results.replaceChildren(messagesTable(await api("POST", `${qpath}/get`,
            { count: +getCount.value || 1, ackmode: ackmode.value, encoding: "auto" })));
          load();
        })),
        h("label", {}, "Replay dead letters", replayCount), button("replay", "Replay", () => act(async () => {
          const r = await api("POST", `${qpath}/replay`, { count: +replayCount.value || 1 }); load(); return r;
        }, (r) => "Replayed: " + JSON.stringify(r)))),
      results),
    publishForm(vhost, "", name, load),
    moveMessagesCard(vhost, name),  // dashboard_shovels.js
    h("div", { className: "card" },
      button("purge", "Purge", () => confirm(`Purge all ready messages of '${name}'?`) && act(async () => {
        await api("DELETE", qpath + "/contents"); load();
      }, "Queue purged"), "danger"), " ",
      button("delete-queue", "Delete queue", () => confirm(`Delete queue '${name}'?`) && act(async () => {
        await api("DELETE", qpath); location.hash = "#/queues";
      }, `Queue '${name}' deleted`), "danger")));
  poll(load);
};

// ---- exchanges
PAGES.exchanges = () => {
  const list = pagedList({ id: "exchanges", path: "exchanges", columns: [
    { label: "Vhost", field: "vhost", sort: "vhost" },
    { label: "Name", field: "name", sort: "name", render: (x) => link(objectHash("exchange", x.vhost, x.name), x.name || "(AMQP default)") },
    { label: "Type", field: "type", sort: "type" },
    { label: "Durable", field: "durable", render: (x) => String(x.durable) },
    rateCol("Publish in", "publish_in"), rateCol("Publish out", "publish_out"),
  ] });
  const form = h("form", { className: "inline card", id: "declare-exchange" }, h("b", {}, "Add exchange"), vhostSelect(),
    h("label", {}, "Name", h("input", { name: "name", required: true })),
    h("label", {}, "Type", h("select", { name: "type" }, ["direct", "fanout", "topic", "headers", "x-delayed-message", "x-consistent-hash"].map((t) => h("option", { value: t }, t)))),
    h("label", {}, h("input", { type: "checkbox", name: "durable", checked: true }), "durable"),
    h("label", {}, "Arguments (JSON)", h("input", { name: "arguments" })),
    h("button", { type: "submit" }, "Add exchange"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const d = formData(form);
    act(async () => {
      await api("PUT", `exchanges/${enc(d.vhost)}/${enc(d.name)}`, { type: d.type, durable: d.durable === "on",
        auto_delete: false, internal: false, arguments: parseJsonField(d.arguments, "Arguments") });
      list.load();
    }, `Exchange '${d.name}' declared`);
  });
  main().append(h("h2", {}, "Exchanges"), list.el, form);
  poll(list.load);
};

PAGES.exchange = (vhost, name) => {
  const xpath = `exchanges/${enc(vhost)}/${enc(exchangePath(name))}`;
  const details = h("pre", { id: "exchange-details" });
  const load = async () => {
    const x = await act(() => api("GET", xpath));
    if (x) details.textContent = JSON.stringify({ type: x.type, durable: x.durable, auto_delete: x.auto_delete,
      internal: x.internal, arguments: x.arguments, policy: x.policy, message_stats: x.message_stats }, null, 1);
  };
  main().append(h("h2", {}, `Exchange ${name || "(AMQP default)"} `, h("small", {}, `in vhost ${vhost}`)),
    h("div", { className: "card" }, details), publishForm(vhost, name, "", load),
    name && !name.startsWith("amq.") ? h("button", { type: "button", className: "danger", id: "delete-exchange", onclick: () =>
      confirm(`Delete exchange '${name}'?`) && act(async () => { await api("DELETE", xpath); location.hash = "#/exchanges"; },
        `Exchange '${name}' deleted`) }, "Delete exchange") : null);
  poll(load);
};

// ---- channels (the connections pages are in dashboard_connections.js)
PAGES.channels = () => {
  const list = pagedList({ id: "channels", path: "channels", columns: [
    { label: "Name", field: "name", sort: "name" }, { label: "User", field: "user", sort: "user" },
    { label: "Vhost", field: "vhost", sort: "vhost" }, { label: "Mode", fields: ["confirm", "transactional"], render: (c) => c.confirm ? "confirm" : (c.transactional ? "tx" : "") },
    { label: "Consumers", field: "consumer_count", num: true, sort: "consumer_count" },
    { label: "Prefetch", field: "prefetch_count", num: true },
    { label: "Unacked", field: "messages_unacknowledged", num: true, sort: "messages_unacknowledged" },
  ] });
  main().append(h("h2", {}, "Channels"), list.el);
  poll(list.load);
};

// ---- users, vhosts, permissions, policies: a small table plus one form that creates or edits
function adminPage({ title, id, path, columns, form, keyOf, deletePath, fill }) {
  const table = h("table", { id });
  async function load() {
    const items = await act(() => api("GET", path));
    if (!items) return;
    table.replaceChildren(h("tr", {}, columns.map(([label]) => h("th", {}, label)), h("th", {})),
      ...items.map((item) => h("tr", { "data-key": keyOf(item) }, columns.map(([, f]) => h("td", {}, f(item))),
        h("td", {}, h("button", { type: "button", className: "edit", onclick: () => fill(form, item) }, "Edit"), " ",
          h("button", { type: "button", className: "danger delete", onclick: () => confirm(`Delete ${keyOf(item)}?`) &&
            act(async () => { await api("DELETE", deletePath(item)); load(); }, `Deleted ${keyOf(item)}`) }, "Delete")))));
  }
  form.classList.add("card");
  form.addEventListener("saved", load);
  main().append(h("h2", {}, title), h("div", { className: "card" }, table), form);
  load();
}

function submitForm(form, handler, okText) {
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const d = formData(form);
    act(async () => { await handler(d); form.dispatchEvent(new Event("saved")); }, okText(d));
  });
  return form;
}
const setFields = (form, values) => { for (const [k, v] of Object.entries(values)) form.elements[k].value = v ?? ""; };
const input = (label, name, attrs = {}) => h("label", {}, label, h("input", { name, ...attrs }));
const tagsText = (t) => Array.isArray(t) ? t.join(",") : (t || "");

PAGES.users = () => adminPage({
  title: "Users", id: "users", path: "users", keyOf: (u) => `user '${u.name}'`,
  columns: [["Name", (u) => u.name], ["Tags", (u) => tagsText(u.tags)]],
  deletePath: (u) => `users/${enc(u.name)}`,
  fill: (f, u) => setFields(f, { name: u.name, password: "", tags: tagsText(u.tags) }),
  form: submitForm(h("form", { className: "inline", id: "user-form" }, h("b", {}, "Add / update user"),
    input("Name", "name", { required: true }), input("Password", "password", { type: "password", placeholder: "unchanged if empty" }),
    input("Tags", "tags", { placeholder: "administrator,monitoring" }), h("button", { type: "submit" }, "Save user")),
  async (d) => {
    const body = { tags: d.tags };
    if (d.password) body.password = d.password;
    else {
      // RabbitMQ needs a password or a hash: keep the existing hash on an edit without a new password.
      const existing = await api("GET", `users/${enc(d.name)}`).catch(() => null);
      if (existing) { body.password_hash = existing.password_hash; body.hashing_algorithm = existing.hashing_algorithm; }
      else body.password = "";
    }
    await api("PUT", `users/${enc(d.name)}`, body);
  }, (d) => `User '${d.name}' saved`),
});

PAGES.vhosts = () => adminPage({
  title: "Virtual hosts", id: "vhosts", path: "vhosts", keyOf: (v) => `vhost '${v.name}'`,
  columns: [["Name", (v) => v.name], ["Description", (v) => v.description], ["Messages", (v) => v.messages ?? ""]],
  deletePath: (v) => `vhosts/${enc(v.name)}`,
  fill: (f, v) => setFields(f, { name: v.name, description: v.description }),
  form: submitForm(h("form", { className: "inline", id: "vhost-form" }, h("b", {}, "Add / update vhost"),
    input("Name", "name", { required: true }), input("Description", "description"), h("button", { type: "submit" }, "Save vhost")),
  (d) => api("PUT", `vhosts/${enc(d.name)}`, { description: d.description }), (d) => `Vhost '${d.name}' saved`),
});

PAGES.permissions = () => adminPage({
  title: "Permissions", id: "permissions", path: "permissions", keyOf: (p) => `permissions of '${p.user}' on '${p.vhost}'`,
  columns: [["User", (p) => p.user], ["Vhost", (p) => p.vhost], ["Configure", (p) => p.configure], ["Write", (p) => p.write], ["Read", (p) => p.read]],
  deletePath: (p) => `permissions/${enc(p.vhost)}/${enc(p.user)}`,
  fill: (f, p) => setFields(f, p),
  form: submitForm(h("form", { className: "inline", id: "permission-form" }, h("b", {}, "Set permissions"),
    input("User", "user", { required: true }), input("Vhost", "vhost", { required: true, value: "/" }),
    input("Configure", "configure", { value: ".*" }), input("Write", "write", { value: ".*" }), input("Read", "read", { value: ".*" }),
    h("button", { type: "submit" }, "Set permissions")),
  (d) => api("PUT", `permissions/${enc(d.vhost)}/${enc(d.user)}`, { configure: d.configure, write: d.write, read: d.read }),
  (d) => `Permissions of '${d.user}' on '${d.vhost}' set`),
});

// Topic permissions (RabbitMQ's): per user, vhost and topic exchange, regular expressions over routing keys.
PAGES["topic-permissions"] = () => adminPage({
  title: "Topic permissions", id: "topic-permissions", path: "topic-permissions",
  keyOf: (p) => `topic permissions of '${p.user}' on '${p.exchange}' in '${p.vhost}'`,
  columns: [["User", (p) => p.user], ["Vhost", (p) => p.vhost], ["Exchange", (p) => p.exchange], ["Write", (p) => p.write], ["Read", (p) => p.read]],
  deletePath: (p) => `topic-permissions/${enc(p.vhost)}/${enc(p.user)}?exchange=${enc(p.exchange)}`,
  fill: (f, p) => setFields(f, p),
  form: submitForm(h("form", { className: "inline", id: "topic-permission-form" }, h("b", {}, "Set topic permissions"),
    input("User", "user", { required: true }), input("Vhost", "vhost", { required: true, value: "/" }),
    input("Exchange", "exchange", { required: true, value: "amq.topic" }), input("Write", "write", { value: ".*" }),
    input("Read", "read", { value: ".*" }), h("button", { type: "submit" }, "Set topic permissions")),
  (d) => api("PUT", `topic-permissions/${enc(d.vhost)}/${enc(d.user)}`, { exchange: d.exchange, write: d.write, read: d.read }),
  (d) => `Topic permissions of '${d.user}' on '${d.exchange}' set`),
});

PAGES.policies = () => adminPage({
  title: "Policies", id: "policies", path: "policies", keyOf: (p) => `policy '${p.name}' in '${p.vhost}'`,
  columns: [["Vhost", (p) => p.vhost], ["Name", (p) => p.name], ["Pattern", (p) => p.pattern], ["Apply to", (p) => p["apply-to"]],
    ["Priority", (p) => p.priority], ["Definition", (p) => JSON.stringify(p.definition)]],
  deletePath: (p) => `policies/${enc(p.vhost)}/${enc(p.name)}`,
  fill: (f, p) => setFields(f, { ...p, "apply-to": p["apply-to"], definition: JSON.stringify(p.definition) }),
  form: submitForm(h("form", { className: "inline", id: "policy-form" }, h("b", {}, "Add / update policy"),
    input("Vhost", "vhost", { required: true, value: "/" }), input("Name", "name", { required: true }),
    input("Pattern", "pattern", { required: true }),
    h("label", {}, "Apply to", h("select", { name: "apply-to" }, ["all", "queues", "exchanges"].map((t) => h("option", { value: t }, t)))),
    input("Priority", "priority", { type: "number", value: 0 }),
    input("Definition (JSON)", "definition", { required: true, placeholder: '{"max-length": 1000}' }),
    h("button", { type: "submit" }, "Save policy")),
  (d) => api("PUT", `policies/${enc(d.vhost)}/${enc(d.name)}`, { pattern: d.pattern, "apply-to": d["apply-to"],
    priority: +d.priority || 0, definition: parseJsonField(d.definition, "Definition") }), (d) => `Policy '${d.name}' saved`),
});

// ---- definitions export / import
PAGES.definitions = () => {
  const exportButton = h("button", { type: "button", id: "export", onclick: () => act(async () => {
    const defs = await api("GET", "definitions");
    const url = URL.createObjectURL(new Blob([JSON.stringify(defs, null, 2)], { type: "application/json" }));
    const a = h("a", { href: url, download: "lavinpy-definitions.json" });
    document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }, "Definitions exported") }, "Download definitions");
  const file = h("input", { type: "file", accept: ".json,application/json", name: "file", id: "import-file" });
  const dryRun = h("input", { type: "checkbox", name: "dry_run", id: "import-dry-run" });
  const result = h("pre", { id: "import-result" });
  const importForm = h("form", { className: "inline" }, file, h("label", {}, dryRun, "dry run"), h("button", { type: "submit" }, "Import"));
  importForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (!file.files.length) { flash("Choose a definitions file first"); return; }
    act(async () => {
      const text = await file.files[0].text();
      const r = await api("POST", "definitions" + (dryRun.checked ? "?dry_run=true" : ""), text);
      result.textContent = r ? JSON.stringify(r, null, 1) : "";
    }, dryRun.checked ? "Dry run done: nothing changed" : "Definitions imported");
  });
  main().append(h("h2", {}, "Definitions"),
    h("div", { className: "card" }, h("h3", {}, "Export"), exportButton),
    h("div", { className: "card" }, h("h3", {}, "Import"), h("p", {}, "A RabbitMQ or lavinpy export; nothing is applied if any part is wrong."), importForm, result));
};

// ---- start
window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", async () => {
  $("#logout").addEventListener("click", () => logout());
  $("#login").addEventListener("submit", onLogin);
  offerSso($("#login"));
  if (await finishSso()) flash("");  // back from the provider with a code: exchanged for a token
  if (loggedIn()) start();
});
