"""Every monitoring face against one object of every kind (every_kind.py): each GET route of the
management API, both Prometheus endpoints with every family, every lavinpyctl list command and
``status``, and the dashboard's pages in Chromium. All must answer and parse: a reader that assumes
a member only some queue kinds have (as ``unacked_count`` on a stream once did) fails here."""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from lavinpy.cli.ctl import LISTS
from lavinpy.http.app import add_routes
from lavinpy.http.metrics import DETAILED_FAMILIES, make_metrics_app

from .conftest import lavinpy_only
from .every_kind import EMPTY_VHOST, EXCHANGES, FIGURES, POLICY, QUEUES, VHOST, World, api_json, fetch, make_world, q
from .test_ctl import ctl
from .test_dashboard import CHROMEDRIVER, CHROMIUM, _login, _severe_console_errors, _wait
from .test_dashboard import browser as browser  # the fixture, for the dashboard test below

pytestmark = lavinpy_only("starts a broker of its own and raises an alarm in it")

# The answers other than 200, each as RabbitMQ documents it: the health checks answer 503 while an
# alarm is in effect (the world has a disk alarm); only its own connection may read an exclusive queue's
# messages (405 RESOURCE_LOCKED, as basic.get from another connection); MQTT over WebSocket's /ws is
# not served with MQTT off, as in this world (404).
EXPECTED_STATUS = {
    "/ws": 404,
    "/api/health/checks/alarms": 503,
    "/api/health/checks/local-alarms": 503,
    f"/api/queues/%2F/{QUEUES['exclusive']}/peek": 405,
}
_PARAM = re.compile(r"\{(\w+)\}")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = make_world(tmp_path_factory.mktemp("every-kind"))
    yield w
    w.close()


# --- the objects, as the API reports them -----------------------------------------------------------

@pytest.mark.timeout(120)
def test_figures_of_every_kind(world: World) -> None:
    b = world.broker
    assert world.blocked_reasons and "disk" in world.blocked_reasons[0]
    for role, name in QUEUES.items():
        info = api_json(b, f"/api/queues/%2F/{q(name)}")
        ready, unacked = FIGURES[role]
        assert (info["messages_ready"], info["messages_unacknowledged"], info["messages"]) == \
            (ready, unacked, ready + unacked), (role, info)
        kind = "stream" if role.startswith("stream") else "quorum" if role == "quorum" else "classic"
        assert info["type"] == kind, info
        assert info["policy"] == (POLICY if role == "policy" else ""), info
        # A stream's consumers read from their own offsets: no head message, no head age.
        assert (info.get("head_message_age_ms") is None) == (ready == 0 or role.startswith("stream")), info
    overview = api_json(b, "/api/overview")
    ready = sum(r for r, _ in FIGURES.values())
    unacked = sum(u for _, u in FIGURES.values())
    assert overview["queue_totals"] == {"messages": ready + unacked, "messages_ready": ready,
                                        "messages_unacknowledged": unacked}
    # Peek reads a stream from its first offset, stamped as deliveries are, and takes nothing.
    peeked = api_json(b, f"/api/queues/%2F/{q(QUEUES['stream'])}/peek?count=3")
    assert [m["properties"]["headers"]["x-stream-offset"] for m in peeked] == [1, 2, 3]
    assert [m["payload"] for m in peeked] == ["s.x-0", "s.x-1", "s.x-2"]
    assert api_json(b, f"/api/queues/%2F/{q(QUEUES['stream_empty'])}/peek?count=3") == []
    classic = api_json(b, f"/api/queues/%2F/{q(QUEUES['classic'])}/peek?count=5")
    assert [m["payload"] for m in classic] == ["c-2", "c-3", "c-4"]  # the ready ones, the head first
    # RabbitMQ's states under the alarm: the raw client published during it (blocked), the consumers'
    # connection has not (blocking). The publish may still be on its way to the broker: wait for it.
    deadline = time.monotonic() + 10
    while (states := sorted(c["state"] for c in api_json(b, "/api/connections"))) != ["blocked", "blocking"]:
        assert time.monotonic() < deadline, states
        time.sleep(0.1)
    assert api_json(b, f"/api/exchanges/%2F/{q(EXCHANGES['delayed'])}")["type"] == "x-delayed-message"


# --- every GET route of the management API ----------------------------------------------------------

def get_routes() -> list[str]:
    """The GET paths the management application registers (built here only to read its route table)."""
    app = web.Application()
    add_routes(app)
    paths = []
    for resource in app.router.resources():
        if any(route.method == "GET" for route in resource):
            info = resource.get_info()
            paths.append(info.get("formatter") or info["path"])
    return paths


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _html_tags(body: bytes) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Tags()
    parser.feed(body.decode())
    parser.close()
    return parser.tags


class Catalogue:
    """What fills each path parameter: every object the API itself lists, per vhost."""

    def __init__(self, world: World) -> None:
        b = world.broker
        self.vhosts = [v["name"] for v in api_json(b, "/api/vhosts")]
        self.queues = {v: [x["name"] for x in api_json(b, f"/api/queues/{q(v)}")] for v in self.vhosts}
        self.exchanges = {v: [x["name"] or "amq.default" for x in api_json(b, f"/api/exchanges/{q(v)}")]
                          for v in self.vhosts}
        self.policies = {v: [x["name"] for x in api_json(b, f"/api/policies/{q(v)}")] for v in self.vhosts}
        self.bindings = {v: api_json(b, f"/api/bindings/{q(v)}") for v in self.vhosts}
        self.users = [u["name"] for u in api_json(b, "/api/users")]
        self.nodes = [n["name"] for n in api_json(b, "/api/nodes")]
        self.connections = [c["name"] for c in api_json(b, "/api/connections")]
        self.permissions = [(p["vhost"], p["user"]) for p in api_json(b, "/api/permissions")]
        self.topic_permissions = sorted({(p["vhost"], p["user"]) for p in api_json(b, "/api/topic-permissions")})
        self.parameters = [(p["component"], p["vhost"], p["name"]) for p in api_json(b, "/api/parameters")]
        self.global_parameters = [p["name"] for p in api_json(b, "/api/global-parameters")]
        self.user_limits = sorted({x["user"] for x in api_json(b, "/api/user-limits")})
        self.operator_policies = {v: [x["name"] for x in api_json(b, f"/api/operator-policies/{q(v)}")]
                                  for v in self.vhosts}
        self.shovels = {v: [x["name"] for x in api_json(b, f"/api/shovels/{q(v)}")] for v in self.vhosts}
        self.ports = sorted({listener["port"] for listener in api_json(b, "/api/overview")["listeners"]})
        _, _, index = fetch(b.http_url + "/", auth=False)
        refs = [attrs.get("src") or attrs.get("href") or "" for _, attrs in _html_tags(index)]
        self.static = [ref.removeprefix("/static/") for ref in refs if ref.startswith("/static/")]

    def bindings_params(self, with_props: bool) -> list[dict[str, str]]:
        out = []
        for vhost, bindings in self.bindings.items():
            for bd in bindings:
                params = {"vhost": vhost, "source": bd["source"] or "amq.default",
                          "kind": "q" if bd["destination_type"] == "queue" else "e",
                          "destination": bd["destination"]}
                if with_props:
                    params["props"] = bd["properties_key"]
                out.append(params)
        return out

    def params(self, template: str) -> list[dict[str, Any]] | None:
        """Every filling of ``template``'s parameters; None when the route's parameters are not known here."""
        names = tuple(_PARAM.findall(template))
        family = template.split("/")[2] if template.startswith("/api/") else template.split("/")[1]
        per_vhost = {"queues": self.queues, "exchanges": self.exchanges, "policies": self.policies,
                     "operator-policies": self.operator_policies, "shovels": self.shovels}
        by_name = {"users": self.users, "nodes": self.nodes, "connections": self.connections,
                   "global-parameters": self.global_parameters}
        if not names:
            return [{}]
        if names == ("vhost",):
            return [{"vhost": v} for v in self.vhosts]
        if names == ("vhost", "name") and family in per_vhost:
            return [{"vhost": v, "name": n} for v, items in per_vhost[family].items() for n in items]
        if names == ("name",) and family in by_name:
            return [{"name": n} for n in by_name[family]]
        if names == ("vhost", "user") and family == "permissions":
            return [{"vhost": v, "user": u} for v, u in self.permissions]
        if names == ("vhost", "user") and family == "topic-permissions":
            return [{"vhost": v, "user": u} for v, u in self.topic_permissions]
        if names == ("user",) and family == "user-limits":
            return [{"user": u} for u in self.user_limits]
        if family == "parameters" and names and set(names) <= {"component", "vhost", "name"}:
            keys = {"component": 0, "vhost": 1, "name": 2}
            fillings = {tuple(p[keys[n]] for n in names) for p in self.parameters}
            return [dict(zip(names, f, strict=True)) for f in sorted(fillings)]
        if names == ("port",):
            return [{"port": p} for p in self.ports]
        if names == ("protocol",):
            return [{"protocol": p} for p in ("amqp", "http", "http/prometheus")]
        if names == ("within", "unit"):
            return [{"within": 1, "unit": u} for u in ("days", "weeks", "months", "years")]
        if names == ("file",):
            return [{"file": f} for f in self.static]
        if family == "bindings" and names[:4] == ("vhost", "source", "kind", "destination"):
            return self.bindings_params(with_props=names[4:] == ("props",))
        return None


def _fill(template: str, values: dict[str, Any]) -> str:
    return _PARAM.sub(lambda m: q(str(values[m.group(1)])), template)


def _body_problem(path: str, content_type: str, body: bytes) -> str | None:
    """Why the body does not parse as its content type says, or None."""
    kind = content_type.split(";")[0].strip()
    try:
        if kind == "application/json":
            json.loads(body)
        elif kind == "text/html":
            if not any(tag == "script" for tag, _ in _html_tags(body)):
                return "an HTML page without its script"
        elif kind == "image/svg+xml":
            ElementTree.fromstring(body)
        elif kind in ("text/javascript", "text/css"):
            body.decode()
            if not body.strip():
                return "empty"
        else:
            return f"unexpected content type {content_type!r}"
    except ValueError as e:  # JSON, UTF-8 and XML errors are ValueErrors
        return f"does not parse as {kind}: {e}"
    return None


def _check(world: World, path: str, problems: list[str]) -> Any:
    status, content_type, body = fetch(world.broker.http_url + path)
    expected = EXPECTED_STATUS.get(path.split("?")[0], 200)
    if status != expected:
        problems.append(f"GET {path}: {status}, expected {expected}: {body[:200]!r}")
        return None
    if expected != 200 and content_type.startswith("text/plain"):
        return None  # a refusal in words (the WebSocket endpoint's answer to a plain GET)
    problem = _body_problem(path, content_type, body)
    if problem:
        problems.append(f"GET {path}: {problem}")
        return None
    return json.loads(body) if content_type.startswith("application/json") else None


@pytest.mark.timeout(180)
def test_every_get_route_answers_and_parses(world: World) -> None:
    cat = Catalogue(world)
    # The listings hold every object made, so each route below is asked about each of them.
    assert set(QUEUES.values()) <= set(cat.queues[VHOST])
    assert set(EXCHANGES.values()) <= set(cat.exchanges[VHOST])
    assert EMPTY_VHOST in cat.vhosts and POLICY in cat.policies[VHOST] and len(cat.connections) == 2
    assert {"dashboard.js", "dashboard.css"} <= set(cat.static)
    problems: list[str] = []
    unknown: list[str] = []
    asked = 0
    for template in get_routes():
        fillings = cat.params(template)
        if fillings is None:
            unknown.append(template)
            continue
        assert fillings, f"no object to ask {template} about"
        for values in fillings:
            path = _fill(template, values)
            reply = _check(world, path, problems)
            asked += 1
            if isinstance(reply, list) and template.startswith("/api/"):
                # the same list paged, sorted and cut, as the dashboard asks for it
                _check(world, path + "?page=1&page_size=500&sort=name&sort_reverse=true&columns=name,vhost",
                       problems)
                asked += 1
    assert not unknown, f"routes with parameters this test cannot fill: {unknown}"
    assert not problems, "\n".join(problems)
    assert asked > 100
    alarms = api_json_any(world, "/api/health/checks/alarms")
    assert alarms["status"] == "failed" and [a["resource"] for a in alarms["alarms"]] == ["disk"]


def api_json_any(world: World, path: str) -> Any:
    """The JSON body whatever the status (a failed health check is a 503 with a body)."""
    return json.loads(fetch(world.broker.http_url + path)[2])


# --- the Prometheus endpoints -------------------------------------------------------------------------

def _scrape(world: World, path: str) -> dict[str, Any]:
    status, content_type, body = fetch(world.broker.metrics_url + path, auth=False)
    assert status == 200, (path, status, body[:300])
    assert content_type.startswith("text/plain"), content_type
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def _samples(families: dict[str, Any], name: str) -> dict[str, float]:
    return {s.labels["queue"]: s.value for s in families[name].samples if s.labels.get("vhost") == VHOST}


@pytest.mark.timeout(120)
def test_metrics_every_family_parses(world: World) -> None:
    app = make_metrics_app(None, None)  # type: ignore[arg-type]  # built only to read its route table
    paths = sorted(r.resource.canonical for r in app.router.routes() if r.method == "GET")  # type: ignore[union-attr]
    assert paths == ["/metrics", "/metrics/detailed"]
    for prefix in ("lavinpy", "rabbitmq"):
        totals = _scrape(world, f"/metrics?prefix={prefix}")
        assert totals[f"{prefix}_queue_messages_unacked"].samples[0].value == sum(u for _, u in FIGURES.values())
        assert totals[f"{prefix}_alarms_free_disk_space_watermark"].samples[0].value == 1
        everything = _scrape(world, f"/metrics/detailed?prefix={prefix}")
        for family in DETAILED_FAMILIES:
            one = _scrape(world, f"/metrics/detailed?prefix={prefix}&family={family}")
            assert one and set(one) <= set(everything), family
        d = f"{prefix}_detailed"
        ready = _samples(everything, f"{d}_queue_messages_ready")
        unacked = _samples(everything, f"{d}_queue_messages_unacked")
        for role, name in QUEUES.items():
            assert (ready[name], unacked[name]) == FIGURES[role], role
        assert _samples(everything, f"{d}_queue_consumers")[QUEUES["stream"]] == 1
        assert QUEUES["stream"] not in _samples(everything, f"{d}_queue_head_message_timestamp")
    # Unknown families are ignored, as RabbitMQ ignores them: the known ones asked for still come.
    coarse = _scrape(world, "/metrics/detailed?family=queue_coarse_metrics")
    assert _scrape(world, "/metrics/detailed?family=no_such_family&family=queue_coarse_metrics").keys() \
        == coarse.keys()
    assert _scrape(world, "/metrics/detailed?family=no_such_family") == {}


# --- lavinpyctl ---------------------------------------------------------------------------------------

@pytest.mark.timeout(180)
def test_every_ctl_list_command_and_status(world: World) -> None:
    b = world.broker
    for command, (_, columns) in LISTS.items():
        rows: dict[str, list[dict[str, Any]]] = {}
        for vhost in (EMPTY_VHOST, VHOST):
            as_json = ctl(b, "-p", vhost, "-f", "json", command)
            assert as_json.returncode == 0, (command, vhost, as_json.stderr)
            rows[vhost] = json.loads(as_json.stdout)
            assert all(set(r) == set(columns) for r in rows[vhost]), (command, rows)
        tsv = ctl(b, "-f", "tsv", command)
        assert tsv.returncode == 0, (command, tsv.stderr)
        lines = tsv.stdout.splitlines()
        assert lines[0].split("\t") == columns and len(lines) == len(rows[VHOST]) + 1, (command, tsv.stdout)
        assert all(len(line.split("\t")) == len(columns) for line in lines), (command, tsv.stdout)
    queues = {r["name"]: r for r in json.loads(
        ctl(b, "-f", "json", "list_queues", "name", "messages", "messages_unacknowledged", "type").stdout)}
    for role, name in QUEUES.items():
        ready, unacked = FIGURES[role]
        assert (queues[name]["messages"], queues[name]["messages_unacknowledged"]) == (ready + unacked, unacked)
    status = ctl(b, "-f", "json", "status")
    assert status.returncode == 0, status.stderr  # the container health check
    info = json.loads(status.stdout)
    assert info["alarms"] == "failed" and info["queues"] == len(api_json(b, "/api/queues"))


# --- the dashboard ------------------------------------------------------------------------------------

_TRACK_FETCHES = """
if (!window.__fetches) {
  const original = window.fetch;
  window.__fetches = { pending: 0, started: 0 };
  window.fetch = async (...args) => {
    window.__fetches.started++;
    window.__fetches.pending++;
    try { return await original(...args); } finally { window.__fetches.pending--; }
  };
}
"""


def _fetches_started(driver: Any) -> int:
    return driver.execute_script("return window.__fetches.started")


def _settled(driver: Any, started_before: int) -> Callable[[], bool]:
    """True once no API call of the page has been in flight for a quarter of a second after one started
    since ``started_before`` (_fetches_started before the navigation), or for half a second when none
    started (the hash change that starts them is handled within milliseconds; a page may make none, as
    the definitions page)."""
    quiet_since: list[float] = []

    def check() -> bool:
        pending, started = driver.execute_script("return [window.__fetches.pending, window.__fetches.started]")
        if pending:
            quiet_since.clear()
            return False
        quiet_since.append(time.monotonic())
        return quiet_since[-1] - quiet_since[0] >= (0.25 if started > started_before else 0.5)

    return check


def _page_problems(driver: Any, where: str) -> list[str]:
    problems = [f"{where}: {e['message']}" for e in _severe_console_errors(driver)]
    flash = driver.find_element("css selector", "#flash")
    if flash.is_displayed() and flash.text and "ok" not in (flash.get_attribute("class") or ""):
        problems.append(f"{where}: the page shows an error: {flash.text}")
    return problems


@pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
                    reason="chromium and chromium-driver are not installed")
@pytest.mark.timeout(240)
def test_dashboard_pages_load_without_errors(world: World, browser: Any) -> None:
    d = browser
    _login(d, world.broker)
    _wait(lambda: d.current_url.endswith("#/overview"), "the overview")
    pages = d.execute_script("return Object.keys(PAGES).map((k) => [k, PAGES[k].length])")
    objects = {"queue": [x["name"] for x in api_json(world.broker, "/api/queues/%2F")],
               "exchange": [x["name"] for x in api_json(world.broker, "/api/exchanges/%2F")]}
    connections = [x["name"] for x in api_json(world.broker, "/api/connections")]
    visits = []
    for page, arity in pages:
        if arity == 0:
            visits.append(f"#/{page}")
        elif page == "connection":  # one connection's page, by name
            assert connections, "no connection to show"
            visits += [f"#/connection/{q(name)}" for name in connections]
        else:
            assert arity == 2 and page in objects, f"page {page!r} takes parameters this test cannot fill"
            visits += [f"#/{page}/%2F/{q(name)}" for name in objects[page]]
    assert len(visits) >= len(pages) + len(QUEUES)
    problems: list[str] = []
    d.execute_script(_TRACK_FETCHES)
    for target in visits:
        # Each page's own errors; the page shown already (the overview, after login) is loaded again.
        started = _fetches_started(d)
        d.execute_script("flash(''); if (location.hash === arguments[0]) route(); else location.hash = arguments[0];",
                         target)
        _wait(_settled(d, started), f"the API calls of {target}")
        _wait(lambda: d.find_elements("css selector", "#main h2"), f"the heading of {target}")
        if target.startswith("#/queue/") and not target.endswith(QUEUES["exclusive"]):
            # the page's peek, on every kind of queue (another connection's exclusive queue is locked)
            started = _fetches_started(d)
            d.find_element("css selector", "#peek").click()
            _wait(_settled(d, started), f"the peek of {target}")
            if not d.find_elements("css selector", "#messages table"):
                problems.append(f"{target}: no peeked messages shown")
        problems += _page_problems(d, target)
    assert not problems, "\n".join(problems)
