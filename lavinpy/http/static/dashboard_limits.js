// lavinpy dashboard: vhost and user limits, operator policies, runtime and global parameters. Each is a
// table with Edit and Delete plus one form, as the users and policies pages (adminPage in dashboard.js).
"use strict";

const jsonText = (v) => JSON.stringify(v);

PAGES.limits = () => {
  adminPage({
    title: "Virtual host limits", id: "vhost-limits", path: "vhost-limits", keyOf: (l) => `limits of vhost '${l.vhost}'`,
    columns: [["Vhost", (l) => l.vhost], ["Limits", (l) => jsonText(l.value)]],
    deletePath: (l) => `parameters/vhost-limits/${enc(l.vhost)}/limits`,
    fill: (f, l) => { const [name, value] = Object.entries(l.value)[0] || ["max-connections", ""]; setFields(f, { vhost: l.vhost, name, value }); },
    form: submitForm(h("form", { className: "inline", id: "vhost-limit-form" }, h("b", {}, "Set vhost limit"),
      input("Vhost", "vhost", { required: true, value: "/" }),
      h("label", {}, "Limit", h("select", { name: "name" }, ["max-connections", "max-queues"].map((t) => h("option", { value: t }, t)))),
      input("Value", "value", { type: "number", required: true, placeholder: "-1: no limit" }),
      h("button", { type: "submit" }, "Set limit")),
    (d) => api("PUT", `vhost-limits/${enc(d.vhost)}/${enc(d.name)}`, { value: +d.value }),
    (d) => `Limit ${d.name} of vhost '${d.vhost}' set`),
  });
  adminPage({
    title: "User limits", id: "user-limits", path: "user-limits", keyOf: (l) => `limits of user '${l.user}'`,
    columns: [["User", (l) => l.user], ["Limits", (l) => jsonText(l.value)]],
    deletePath: (l) => `user-limits/${enc(l.user)}/all`,
    fill: (f, l) => { const [name, value] = Object.entries(l.value)[0] || ["max-connections", ""]; setFields(f, { user: l.user, name, value }); },
    form: submitForm(h("form", { className: "inline", id: "user-limit-form" }, h("b", {}, "Set user limit"),
      input("User", "user", { required: true }),
      h("label", {}, "Limit", h("select", { name: "name" }, ["max-connections", "max-channels"].map((t) => h("option", { value: t }, t)))),
      input("Value", "value", { type: "number", required: true, placeholder: "-1: no limit" }),
      h("button", { type: "submit" }, "Set limit")),
    (d) => api("PUT", `user-limits/${enc(d.user)}/${enc(d.name)}`, { value: +d.value }),
    (d) => `Limit ${d.name} of user '${d.user}' set`),
  });
};

PAGES["operator-policies"] = () => adminPage({
  title: "Operator policies", id: "operator-policies", path: "operator-policies",
  keyOf: (p) => `operator policy '${p.name}' in '${p.vhost}'`,
  columns: [["Vhost", (p) => p.vhost], ["Name", (p) => p.name], ["Pattern", (p) => p.pattern], ["Apply to", (p) => p["apply-to"]],
    ["Priority", (p) => p.priority], ["Definition", (p) => jsonText(p.definition)]],
  deletePath: (p) => `operator-policies/${enc(p.vhost)}/${enc(p.name)}`,
  fill: (f, p) => setFields(f, { ...p, "apply-to": p["apply-to"], definition: jsonText(p.definition) }),
  form: submitForm(h("form", { className: "inline", id: "operator-policy-form" }, h("b", {}, "Add / update operator policy"),
    input("Vhost", "vhost", { required: true, value: "/" }), input("Name", "name", { required: true }),
    input("Pattern", "pattern", { required: true }),
    h("label", {}, "Apply to", h("select", { name: "apply-to" }, ["queues", "all", "classic_queues", "streams"].map((t) => h("option", { value: t }, t)))),
    input("Priority", "priority", { type: "number", value: 0 }),
    input("Definition (JSON)", "definition", { required: true, placeholder: '{"max-length": 100000, "message-ttl": 86400000}' }),
    h("button", { type: "submit" }, "Save operator policy")),
  (d) => api("PUT", `operator-policies/${enc(d.vhost)}/${enc(d.name)}`, { pattern: d.pattern, "apply-to": d["apply-to"],
    priority: +d.priority || 0, definition: parseJsonField(d.definition, "Definition") }), (d) => `Operator policy '${d.name}' saved`),
});

PAGES.parameters = () => {
  adminPage({
    title: "Runtime parameters", id: "parameters", path: "parameters",
    keyOf: (p) => `parameter '${p.name}' of '${p.component}' in '${p.vhost}'`,
    columns: [["Component", (p) => p.component], ["Vhost", (p) => p.vhost], ["Name", (p) => p.name], ["Value", (p) => jsonText(p.value)]],
    deletePath: (p) => `parameters/${enc(p.component)}/${enc(p.vhost)}/${enc(p.name)}`,
    fill: (f, p) => setFields(f, { component: p.component, vhost: p.vhost, name: p.name, value: jsonText(p.value) }),
    form: submitForm(h("form", { className: "inline", id: "parameter-form" }, h("b", {}, "Set parameter"),
      input("Component", "component", { required: true, placeholder: "shovel" }), input("Vhost", "vhost", { required: true, value: "/" }),
      input("Name", "name", { required: true }), input("Value (JSON)", "value", { required: true }),
      h("button", { type: "submit" }, "Save parameter")),
    (d) => api("PUT", `parameters/${enc(d.component)}/${enc(d.vhost)}/${enc(d.name)}`,
      { component: d.component, vhost: d.vhost, name: d.name, value: parseJsonField(d.value, "Value") }),
    (d) => `Parameter '${d.name}' saved`),
  });
  adminPage({
    title: "Global parameters", id: "global-parameters", path: "global-parameters", keyOf: (p) => `global parameter '${p.name}'`,
    columns: [["Name", (p) => p.name], ["Value", (p) => jsonText(p.value)]],
    deletePath: (p) => `global-parameters/${enc(p.name)}`,
    fill: (f, p) => setFields(f, { name: p.name, value: jsonText(p.value) }),
    form: submitForm(h("form", { className: "inline", id: "global-parameter-form" }, h("b", {}, "Set global parameter"),
      input("Name", "name", { required: true, placeholder: "cluster_name" }), input("Value (JSON)", "value", { required: true, placeholder: '"my-cluster"' }),
      h("button", { type: "submit" }, "Save global parameter")),
    (d) => api("PUT", `global-parameters/${enc(d.name)}`, { name: d.name, value: parseJsonField(d.value, "Value") }),
    (d) => `Global parameter '${d.name}' saved`),
  });
};
