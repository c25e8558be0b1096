"""The web dashboard in a real browser: Debian's chromium, headless, driven by Selenium through
Debian's chromedriver (no browser download). Skipped only when chromium is not installed."""

from __future__ import annotations

import shutil
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import http_call, lavinpy_only

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = [
    lavinpy_only("the dashboard is lavinpy's"),
    pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
                       reason="chromium and chromium-driver are not installed"),
]


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _wait(predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as e:  # an element replaced while reading it: try again
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def _text(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css).text


def _element(driver: Any, css: str) -> Any:
    """The element once the page has rendered it (pages render after their API calls answer)."""
    from selenium.webdriver.common.by import By

    return _wait(lambda: driver.find_elements(By.CSS_SELECTOR, css), css)[0]


def _click(driver: Any, css: str) -> None:
    """Click the element once rendered. A page's poll re-renders it: one replaced between being found and
    clicked raises StaleElementReferenceException without having been clicked, so it is found again."""
    from selenium.webdriver.common.by import By

    def click() -> bool:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        if not found:
            return False
        found[0].click()
        return True

    _wait(click, f"a click on {css}")


def _fill(driver: Any, css: str, value: str) -> None:
    field = _element(driver, css)
    field.clear()
    field.send_keys(value)


def _accept_confirm(driver: Any) -> None:
    _wait(lambda: driver.switch_to.alert, "the confirmation dialog", 5).accept()


def _login(driver: Any, broker: Any, user: str = "guest", password: str = "guest") -> None:
    driver.get(broker.http_url + "/")
    _fill(driver, "#login input[name=username]", user)
    _fill(driver, "#login input[name=password]", password)
    _click(driver, "#login button")


def _queue_field(driver: Any, field: str) -> str:
    return _text(driver, f'#queue-details td[data-field="{field}"]')


def _rate(text: str) -> float:
    return float(text.removesuffix("/s"))


def _severe_console_errors(driver: Any) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_login_declare_publish_peek_purge_delete(browser: Any, broker: Any, tmp_path: Path) -> None:
    d = browser
    queue = _name("dash")
    qpath = "/api/queues/%2F/" + urllib.parse.quote(queue, safe="")
    _login(d, broker)
    _wait(lambda: "guest" in _text(d, "#whoami") and d.current_url.endswith("#/overview"), "the overview")
    published_before = int(_wait(lambda: _text(d, "#total-publish"), "the totals"))

    # Declare the queue through the page.
    _click(d, 'a[href="#/queues"]')
    _fill(d, "#declare-queue input[name=name]", queue)
    _click(d, "#declare-queue button[type=submit]")
    _wait(lambda: f"Queue '{queue}' declared" in _text(d, "#flash"), "the declare message")
    status, info, _ = http_call(broker, "GET", qpath)
    assert status == 200 and info["durable"] is True, info

    # The queue list links to its page; publish five messages through the page's form.
    _wait(lambda: d.find_elements("link text", queue), "the queue in the list")[0].click()
    _wait(lambda: _queue_field(d, "messages") == "0", "the queue page")
    for i in range(5):
        _fill(d, ".publish-form textarea[name=payload]", f"hello {i}")
        _click(d, ".publish-form button[type=submit]")
        _wait(lambda: _text(d, "#flash") == "Message published", "the publish message")
    _wait(lambda: _queue_field(d, "messages") == "5", "the count to reach 5")
    assert http_call(broker, "GET", qpath)[1]["messages"] == 5

    # Peek reads without taking: two messages shown, five still in the queue.
    _fill(d, "#peek-count", "2")
    _click(d, "#peek")
    rows = _wait(lambda: d.find_elements("css selector", "#messages tbody tr"), "peeked messages")
    assert [r.find_element("css selector", "td.payload").text for r in rows] == ["hello 0", "hello 1"]
    assert http_call(broker, "GET", qpath)[1]["messages"] == 5

    # The overview's totals and publish rate (sampled every 5 s) show the publishes.
    _click(d, 'a[href="#/overview"]')
    _wait(lambda: int(_text(d, "#total-publish")) >= published_before + 5, "the publish total to grow")
    _wait(lambda: _rate(_text(d, "#rate-publish")) > 0, "a publish rate above 0", timeout=20)
    shot = tmp_path / "dashboard-overview.png"
    assert d.save_screenshot(str(shot)) and shot.stat().st_size > 10_000

    # Purge, then delete, from the queue page.
    d.get(f"{broker.http_url}/#/queue/%2F/{urllib.parse.quote(queue, safe='')}")
    _wait(lambda: _queue_field(d, "messages") == "5", "the queue page again")
    _click(d, "#purge")
    _accept_confirm(d)
    _wait(lambda: _queue_field(d, "messages") == "0", "the count after purge")
    assert http_call(broker, "GET", qpath)[1]["messages"] == 0
    _click(d, "#delete-queue")
    _accept_confirm(d)
    _wait(lambda: d.current_url.endswith("#/queues"), "the queue list after delete")
    assert http_call(broker, "GET", qpath)[0] == 404
    assert _severe_console_errors(d) == []


def test_wrong_password_stays_on_login(browser: Any, broker: Any) -> None:
    _login(browser, broker, "guest", "not-the-password")
    _wait(lambda: _text(browser, "#flash") == "Login failed", "the login error")
    assert browser.find_element("css selector", "#nav").is_displayed() is False
    assert browser.execute_script("return sessionStorage.length") == 0


def test_queue_list_pages_and_sorts_through_the_api(browser: Any, broker: Any) -> None:
    prefix = _name("dashpage")
    names = [f"{prefix}-{i:03d}" for i in range(60)]
    # Matched by every partly typed filter but not by the whole one: "60 of" then shows that the filter
    # typed last has been applied. (Its 300 ms debounce can fire between two typed keys; a click on
    # "next" before the last one fired was undone by it, back to page 1.)
    decoy = prefix[:-1] + "-decoy"
    try:
        assert http_call(broker, "PUT", "/api/queues/%2F/" + decoy, {"durable": False})[0] in (201, 204)
        for i, name in enumerate(names):
            q = "/api/queues/%2F/" + name
            assert http_call(broker, "PUT", q, {"durable": False})[0] in (201, 204)
            if i in (7, 42):  # two queues with messages, to sort by depth
                for _ in range(i):
                    http_call(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
                              {"routing_key": name, "payload": "x", "payload_encoding": "string", "properties": {}})
        d = browser
        _login(d, broker)
        _wait(lambda: d.current_url.endswith("#/overview"), "the overview")
        _click(d, 'a[href="#/queues"]')
        _fill(d, "#main input.filter", prefix)

        def first_names() -> list[str]:
            # One script reads every row at once: read row by row (two driver round trips a row), a page of
            # 50 took longer on a loaded machine than the page's poll, which replaced the rows mid-read
            # every time (StaleElementReferenceException until the wait ran out).
            return d.execute_script(
                "return Array.from(document.querySelectorAll('#queues tbody tr'), r => r.cells[1].innerText.trim())")

        _wait(lambda: _text(d, ".page-info").startswith("page 1 of 2 \u00b7 60 of "), "the filtered count")
        _wait(lambda: first_names() == names[:50], "the first page's rows")
        _click(d, "button.next")
        _wait(lambda: _text(d, ".page-info").startswith("page 2 of 2"), "page 2")
        _wait(lambda: first_names() == names[50:], "the second page's rows")
        # Sorting by total messages twice: descending, the deepest queue first.
        _click(d, 'th[data-sort="messages"]')
        _wait(lambda: d.find_elements("css selector", 'th.sorted-asc[data-sort="messages"]'), "the ascending sort")
        _click(d, 'th[data-sort="messages"]')
        _wait(lambda: first_names()[:2] == [names[42], names[7]], "the deepest queues first")
        assert _text(d, ".page-info").startswith("page 1 of 2")  # a new sort starts at page 1
    finally:
        for name in [*names, decoy]:
            http_call(broker, "DELETE", "/api/queues/%2F/" + name)
