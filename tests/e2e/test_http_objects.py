"""The management API's authentication, errors and list parameters (real HTTP, real broker)."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
import uuid

from .conftest import http_call, make_admin


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_wrong_password_is_401_with_challenge(broker):
    status, body, headers = http_call(broker, "GET", "/api/exchanges", password="wrong")
    assert status == 401
    assert body["error"] == "not_authorised" and body["reason"]
    assert headers["WWW-Authenticate"].startswith("Basic")


def test_no_credentials_is_401(broker):
    request = urllib.request.Request(broker.http_url + "/api/exchanges")
    try:
        urllib.request.urlopen(request, timeout=10)
        raise AssertionError("expected 401")
    except urllib.error.HTTPError as e:
        assert e.code == 401
        assert "WWW-Authenticate" in e.headers


def test_user_without_tags_is_403(fresh_broker):
    admin = make_admin(fresh_broker)
    admin.add_user("plain", "pw")
    admin.set_permissions("plain", "/", ".*", ".*", ".*")
    admin.apply()
    status, body, _ = http_call(fresh_broker, "GET", "/api/exchanges", user="plain", password="pw")
    assert status == 403
    assert body == {"error": "not_authorised", "reason": "Not management user"}


def test_unknown_path_is_404_json(broker):
    status, body, _ = http_call(broker, "GET", "/api/no-such-thing")
    assert status == 404
    assert body == {"error": "Object Not Found", "reason": "Not Found"}


def test_unknown_vhost_is_404(broker):
    status, body, _ = http_call(broker, "GET", "/api/exchanges/nowhere")
    assert status == 404
    assert body["error"] == "Object Not Found"


def test_exchanges_listed_with_default_vhost_as_percent_2f(broker):
    status, body, _ = http_call(broker, "GET", "/api/exchanges/%2F")
    assert status == 200
    names = {x["name"] for x in body}
    assert {"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers"} <= names
    direct = next(x for x in body if x["name"] == "amq.direct")
    assert direct["vhost"] == "/" and direct["type"] == "direct" and direct["durable"] is True


def test_paged_list_shape_as_rabbitmq(broker):
    status, body, _ = http_call(broker, "GET", "/api/exchanges/%2F?page=1&page_size=2&name=amq.&sort=name"
                                               "&sort_reverse=true&columns=name,type")
    assert status == 200
    assert set(body) == {"filtered_count", "item_count", "items", "page", "page_count", "page_size",
                         "total_count"}
    assert body["page"] == 1 and body["page_size"] == 2 and body["item_count"] == 2
    assert body["filtered_count"] >= 5 and body["total_count"] > body["filtered_count"]
    assert body["page_count"] == -(-body["filtered_count"] // 2)
    names = [x["name"] for x in body["items"]]
    assert names == sorted(names, reverse=True)
    assert all(set(x) == {"name", "type"} for x in body["items"])


def test_name_regex_filter_and_bad_page(broker):
    status, body, _ = http_call(broker, "GET", "/api/exchanges/%2F?name=%5Eamq%5C.(direct%7Cfanout)%24"
                                               "&use_regex=true")
    assert status == 200
    assert sorted(x["name"] for x in body) == ["amq.direct", "amq.fanout"]
    status, body, _ = http_call(broker, "GET", "/api/exchanges?page=0")
    assert status == 400 and body["error"] == "bad_request" and "page" in body["reason"]


def test_basic_header_garbage_is_401(broker):
    status, _, _ = http_call(broker, "GET", "/api/exchanges",
                             headers={"Authorization": "Basic " + base64.b64encode(b"nocolon").decode()})
    assert status == 401
