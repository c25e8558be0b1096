// lavinpy dashboard: the shovels page (/api/shovels: state, reason, messages moved; pause or resume, restart, delete) and the
// queue page's "Move messages" card, a one-off shovel to another queue (src-delete-after: queue-length), as
// LavinMQ's UI has it. Shovels are defined through /api/parameters/shovel/{vhost}/{name}.
"use strict";

// "amqp:///vhost": this node (no host) and no credentials, as RabbitMQ's UI writes it: the shovel runs as the
// user who defines it (the logged-in user), so the move needs that user's permissions and no password.
const localShovelUri = (vhost) => `amqp:///${enc(vhost)}`;

function moveMessagesCard(vhost, queue) {
  const form = h("form", { className: "inline", id: "move-messages" }, h("b", {}, "Move messages"),
    h("label", {}, "to queue", h("input", { name: "destination", required: true, id: "move-destination" })),
    h("button", { type: "submit" }, "Move messages"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const destination = formData(form).destination;
    const name = `Move ${queue} to ${destination}`;
    const uri = localShovelUri(vhost);
    act(async () => {
      await api("PUT", `parameters/shovel/${enc(vhost)}/${enc(name)}`, { component: "shovel", vhost, name, value: {
        "src-uri": uri, "src-queue": queue, "dest-uri": uri, "dest-queue": destination,
        "src-delete-after": "queue-length", "ack-mode": "on-confirm" } });
    }, `Moving the messages of '${queue}' to '${destination}' (shovel '${name}')`);
  });
  return h("div", { className: "card" }, form);
}

PAGES.shovels = () => {
  const table = h("table", { id: "shovels" });
  const load = async () => {
    const rows = await act(() => api("GET", "shovels")) || [];
    table.replaceChildren(h("tr", {}, ["Vhost", "Name", "State", "Source", "Destination", "Forwarded", "Remaining unacked",
      "Remaining", "Reason", ""].map((t) => h("th", {}, t))),
      ...rows.map((s) => h("tr", {}, h("td", {}, s.vhost), h("td", {}, s.name), h("td", {}, s.state),
        h("td", {}, `${s.src_uri} ${s.src_queue ?? s.src_exchange ?? ""}`),
        h("td", {}, `${s.dest_uri} ${s.dest_queue ?? s.dest_exchange ?? ""}`),
        h("td", { className: "num" }, s.forwarded), h("td", { className: "num" }, s.remaining_unacked),
        h("td", { className: "num" }, s.remaining), h("td", {}, s.reason || ""),
        h("td", {},
          h("button", { type: "button", className: "pause-resume", onclick: () => act(async () => {
            await api("PUT", `shovels/${enc(s.vhost)}/${enc(s.name)}/${s.state === "paused" ? "resume" : "pause"}`);
            load();
          }, `Shovel '${s.name}' ${s.state === "paused" ? "resumed" : "paused"}`) },
          s.state === "paused" ? "Resume" : "Pause"), " ",
          h("button", { type: "button", onclick: () => act(async () => {
            await api("DELETE", `shovels/vhost/${enc(s.vhost)}/${enc(s.name)}/restart`); load();
          }, `Shovel '${s.name}' restarted`) }, "Restart"), " ",
          h("button", { type: "button", className: "danger", onclick: () => confirm(`Delete shovel '${s.name}'?`) &&
            act(async () => { await api("DELETE", `shovels/vhost/${enc(s.vhost)}/${enc(s.name)}`); load(); },
              `Shovel '${s.name}' deleted`) }, "Delete")))));
  };
  main().append(h("h2", {}, "Shovels"), h("div", { className: "card" }, table));
  poll(load);
};
