// lavinpy dashboard: the federation page. Upstreams (/api/parameters/federation-upstream: add one by name and
// URI, delete) and the links that run (/api/federation-links: status, error, messages; restart). Which
// exchanges are federated is a policy's business (federation-upstream or federation-upstream-set).
"use strict";

PAGES.federation = () => {
  const upstreams = h("table", { id: "federation-upstreams" });
  const links = h("table", { id: "federation-links" });
  const form = h("form", { className: "inline", id: "add-upstream" }, h("b", {}, "Add upstream"),
    input("Vhost", "vhost", { required: true, value: "/" }), input("Name", "name", { required: true }),
    input("URI", "uri", { required: true, placeholder: "amqp://user:password@host/vhost", size: 40 }),
    input("Max hops", "max-hops", { type: "number", min: 1, value: 1 }),
    h("button", { type: "submit" }, "Add upstream"));
  const load = async () => {
    const ups = await act(() => api("GET", "parameters/federation-upstream")) || [];
    upstreams.replaceChildren(h("tr", {}, ["Vhost", "Name", "URI", "Max hops", "Ack mode", ""].map((t) => h("th", {}, t))),
      ...ups.map((u) => h("tr", {}, h("td", {}, u.vhost), h("td", {}, u.name),
        h("td", {}, [].concat(u.value.uri).join(" ")), h("td", { className: "num" }, u.value["max-hops"] ?? 1),
        h("td", {}, u.value["ack-mode"] ?? "on-confirm"),
        h("td", {}, h("button", { type: "button", className: "danger", onclick: () =>
          confirm(`Delete upstream '${u.name}'?`) && act(async () => {
            await api("DELETE", `parameters/federation-upstream/${enc(u.vhost)}/${enc(u.name)}`); load();
          }, `Upstream '${u.name}' deleted`) }, "Delete")))));
    const rows = await act(() => api("GET", "federation-links")) || [];
    links.replaceChildren(h("tr", {}, ["Vhost", "Exchange or queue", "Upstream", "Upstream's", "URI", "Status", "Forwarded",
      "Bindings", "Error", ""].map((t) => h("th", {}, t))),
      ...rows.map((l) => h("tr", {}, h("td", {}, l.vhost), h("td", {}, `${l.type} ${l[l.type]}`), h("td", {}, l.upstream),
        h("td", {}, l[`upstream_${l.type}`]), h("td", {}, l.uri), h("td", {}, l.status),
        h("td", { className: "num" }, l.messages_forwarded), h("td", { className: "num" }, l.bindings ?? ""),
        h("td", {}, l.error || ""),
        h("td", {}, h("button", { type: "button", onclick: () => act(async () => {
          await api("DELETE", `federation-links/vhost/${enc(l.vhost)}/${enc(l.id)}/${enc(l.node)}/restart`); load();
        }, `Link of ${l.type} '${l[l.type]}' from '${l.upstream}' restarted`) }, "Restart")))));
  };
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = formData(form);
    act(async () => {
      await api("PUT", `parameters/federation-upstream/${enc(f.vhost)}/${enc(f.name)}`, {
        component: "federation-upstream", vhost: f.vhost, name: f.name,
        value: { uri: f.uri, "max-hops": Number(f["max-hops"] || 1) } });
      load();
    }, `Upstream '${f.name}' added`);
  });
  main().append(h("h2", {}, "Federation"), h("div", { className: "card" }, form),
    h("h3", {}, "Upstreams"), h("div", { className: "card" }, upstreams),
    h("h3", {}, "Links"), h("div", { className: "card" }, links));
  poll(load);
};
