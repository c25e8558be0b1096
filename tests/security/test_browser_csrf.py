"""The cross-site attack in a real browser (Debian's headless chromium through Selenium): the browser
holds the API's Basic credentials (the user opened an API link with them), then visits a page of
another origin that submits a text/plain form and a no-cors fetch to the API. Neither changes anything;
the dashboard, from its own origin, still declares and deletes."""

from __future__ import annotations

import http.server
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import http_call

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
pytestmark = pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
                                reason="chromium and chromium-driver are not installed")

ATTACK = """<!doctype html><html><body>
<form id="f" method="POST" enctype="text/plain" action="{api}/api/definitions">
  <input name='{{"queues": [{{"name": "{form_queue}", "vhost": "/", "x": "' value='"}}]}}'>
</form>
<script>
fetch("{api}/api/queues/%2F/{fetch_queue}", {{method: "PUT", mode: "no-cors", credentials: "include",
      headers: {{"Content-Type": "text/plain"}}, body: '{{"durable": true}}'}})
  .finally(() => {{ document.title = "fetched"; document.getElementById("f").submit(); }});
</script></body></html>"""


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _serve(page: str) -> tuple[http.server.ThreadingHTTPServer, int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    # Threads: the browser opens speculative connections that send nothing, which would hold a
    # single-threaded server (and its shutdown) until the browser drops them.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def _wait(check: Any, what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_page_of_another_origin_cannot_change_the_broker(broker, browser):
    d = browser
    suffix = uuid.uuid4().hex[:8]
    form_queue, fetch_queue = f"by-form-{suffix}", f"by-fetch-{suffix}"
    api = f"http://127.0.0.1:{broker.http_port}"
    # The browser caches the Basic credentials of the API's origin.
    d.get(f"http://guest:guest@127.0.0.1:{broker.http_port}/api/whoami")
    assert "guest" in d.page_source
    server, port = _serve(ATTACK.format(api=api, form_queue=form_queue, fetch_queue=fetch_queue))
    try:
        d.get(f"http://localhost:{port}/")  # another origin: another host name and port
        # The fetch is sent, then the form (a 204 would leave the browser on the page).
        _wait(lambda: d.current_url.startswith(api) or d.title == "fetched", "the attack's requests")
        time.sleep(1.0)
        url, page = d.current_url, d.page_source
    finally:
        server.shutdown()
    if url.startswith(api):  # the form's answer, as the browser shows it
        assert "forbidden" in page, page[:500]
    for queue in (form_queue, fetch_queue):
        assert http_call(broker, "GET", f"/api/queues/%2F/{queue}")[0] == 404, queue


def test_the_dashboard_still_changes_things(broker, browser):
    d = browser
    queue = f"dash-{uuid.uuid4().hex[:8]}"
    d.get(f"http://127.0.0.1:{broker.http_port}/")
    from selenium.webdriver.common.by import By

    _wait(lambda: d.find_elements(By.CSS_SELECTOR, "#login input[name=username]"), "the login form")
    d.find_element(By.CSS_SELECTOR, "#login input[name=username]").send_keys("guest")
    d.find_element(By.CSS_SELECTOR, "#login input[name=password]").send_keys("guest")
    d.find_element(By.CSS_SELECTOR, "#login button").click()
    _wait(lambda: d.current_url.endswith("#/overview"), "the overview")
    # The page's own API helper: a same-origin fetch with a JSON body, as every dashboard form sends.
    status = d.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        f"api('PUT', 'queues/%2F/{queue}', {{durable: true}}).then(() => done('ok'), (e) => done(String(e)));")
    assert status == "ok"
    assert http_call(broker, "GET", f"/api/queues/%2F/{queue}")[0] == 200
    status = d.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        f"api('DELETE', 'queues/%2F/{queue}').then(() => done('ok'), (e) => done(String(e)));")
    assert status == "ok"
    assert http_call(broker, "GET", f"/api/queues/%2F/{queue}")[0] == 404
