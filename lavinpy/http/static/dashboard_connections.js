// lavinpy dashboard: the connections list and one connection's page, for every protocol (AMQP 0-9-1 and
// MQTT: an MQTT row has no channels, and its client is named by its client id instead of a product).
"use strict";

const connectionHash = (name) => `#/connection/${enc(name)}`;
const clientOf = (c) => get(c, "client_properties.product") || get(c, "client_properties.client_id") || "";

function closeConnection(c, then) {
  return h("button", { type: "button", className: "danger close-connection", onclick: () =>
    confirm(`Close connection ${c.name}?`) && act(async () => {
      await api("DELETE", `connections/${enc(c.name)}`, undefined, { "X-Reason": "Closed via management plugin" });
      then();
    }, "Connection closed") }, "Close");
}

PAGES.connections = () => {
  const list = pagedList({ id: "connections", path: "connections", columns: [
    { label: "Name", field: "name", sort: "name", render: (c) => link(connectionHash(c.name), c.name) },
    { label: "User", field: "user", sort: "user" },
    { label: "Vhost", field: "vhost", sort: "vhost" }, { label: "Protocol", field: "protocol", sort: "protocol" },
    { label: "Channels", field: "channels", num: true, sort: "channels" },
    // RabbitMQ's states: blocking (an alarm is on, nothing held back yet), blocked (its publishes are held)
    { label: "State", field: "state", sort: "state", render: (c) => h("span", { className: "state state-" + c.state }, c.state) },
    { label: "Client", fields: ["client_properties.product", "client_properties.client_id"], render: clientOf },
  ], rowActions: (c, reload) => closeConnection(c, reload) });
  main().append(h("h2", {}, "Connections"), list.el);
  poll(list.load);
};

PAGES.connection = (name) => {
  const path = `connections/${enc(name)}`;
  const details = h("table", { id: "connection-details" });
  const extra = h("div", { id: "connection-extra" });
  const load = async () => {
    const c = await act(() => api("GET", path));
    if (!c) return;
    const rows = [["Protocol", c.protocol], ["User", c.user], ["Vhost", c.vhost], ["State", c.state],
      ["Client", clientOf(c)], ["Peer", `${c.peer_host}:${c.peer_port}`], ["Listener", `${c.host}:${c.port}`],
      ["TLS", c.ssl ? (c.ssl_protocol || "yes") : "no"], ["Login", `${c.auth_mechanism} (${c.auth_backend || "-"})`], [c.protocol.startsWith("MQTT") ? "Keepalive" : "Heartbeat", c.timeout],
      ["Connected at", new Date(c.connected_at).toISOString()], ["Received", `${c.recv_oct} B`], ["Sent", `${c.send_oct} B`]];
    details.replaceChildren(...rows.map(([label, value]) =>
      h("tr", {}, h("th", {}, label), h("td", { "data-field": label.toLowerCase().replace(/ /g, "_") }, value ?? ""))));
    const session = c.mqtt_session;
    if (session) {  // MQTT: the client's session and its subscriptions
      extra.replaceChildren(h("h3", {}, "MQTT session"),
        h("p", {}, `client id ${session.client_id}, clean session ${session.clean_session}, `
          + `${session.messages_unacknowledged} awaiting PUBACK or PUBREC, ${session.pubrel_pending ?? 0} awaiting PUBCOMP`),
        h("table", { id: "mqtt-subscriptions" }, h("tr", {}, ["Topic filter", "QoS", "Queue"].map((t) => h("th", {}, t))),
          ...session.subscriptions.map((s) => h("tr", {}, h("td", {}, s.topic_filter), h("td", { className: "num" }, s.qos),
            h("td", {}, link(objectHash("queue", c.vhost, s.queue), s.queue))))));
    } else {
      const channels = await act(() => api("GET", `${path}/channels`)) || [];
      extra.replaceChildren(h("h3", {}, "Channels"), h("table", { id: "connection-channels" },
        h("tr", {}, ["Channel", "Mode", "Consumers", "Prefetch", "Unacked"].map((t) => h("th", {}, t))),
        ...channels.map((ch) => h("tr", {}, h("td", {}, ch.number), h("td", {}, ch.confirm ? "confirm" : (ch.transactional ? "tx" : "")),
          h("td", { className: "num" }, ch.consumer_count), h("td", { className: "num" }, ch.prefetch_count),
          h("td", { className: "num" }, ch.messages_unacknowledged)))));
    }
  };
  main().append(h("h2", {}, "Connection ", h("small", {}, name)), h("div", { className: "card" }, details), extra,
    closeConnection({ name }, () => { location.hash = "#/connections"; }));
  poll(load);
};
