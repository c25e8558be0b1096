"""The dashboard's single sign-on keeps its token fresh, in headless Chromium against the real OpenID
Connect provider (tests/e2e/oidc_provider.py) issuing short-lived tokens: with a refresh token the page
gets a new access token before the old one expires and keeps working past its exp; without one it
prompts to sign in again before the token runs out, and signing in again replaces the token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import lavinpy_only
from .oidc_provider import OAuthBroker, OIDCProvider, claims_of, wait_past
from .oidc_provider import ob as ob  # one provider and one broker for the module
from .oidc_provider import provider as provider
from .test_dashboard import CHROMEDRIVER, CHROMIUM, _click, _fill, _text, _wait
from .test_dashboard import browser as browser  # the headless Chromium fixture

pytestmark = [lavinpy_only("starts lavinpy with the oauth2 backend"),
              pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
                                 reason="chromium and chromium-driver are not installed")]

SCOPES = ["openid", "rabbitmq.tag:administrator", "rabbitmq.read:*/*"]


def _sign_in(ob: OAuthBroker, provider: OIDCProvider, browser: Any, user: str) -> str:
    """Through the provider's login page; the access token the page then holds."""
    browser.get(f"{ob.broker.http_url}/")
    _click(browser, "#sso-login")
    _wait(lambda: browser.current_url.startswith(f"{provider.issuer}/authorize?"), "the provider's login page")
    _fill(browser, "#username", user)
    _click(browser, "#sign-in")
    _wait(lambda: _text(browser, "#whoami") == f"{user} (administrator)", "the dashboard signed in by SSO")
    return str(browser.execute_script("return sessionStorage.getItem('lavinpy.token')"))


def _whoami_status(browser: Any) -> int:
    """The API's answer to the page's current token (as the page sends it)."""
    return int(browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/api/whoami', {headers: {Authorization: 'Bearer ' + sessionStorage.getItem('lavinpy.token')}})"
        ".then(r => done(r.status), () => done(0));"))


def test_the_dashboard_refreshes_its_token_before_it_expires(ob: OAuthBroker, provider: OIDCProvider,
                                                             browser: Any) -> None:
    provider.add_client("dashboard", SCOPES, lifetime=6, refresh=True, redirect_uris=[f"{ob.broker.http_url}/"])
    first = _sign_in(ob, provider, browser, "sso-refresher")
    refreshed = provider.refreshes
    _wait(lambda: browser.execute_script("return sessionStorage.getItem('lavinpy.token')") != first,
          "a refreshed token", 10)
    assert provider.refreshes > refreshed  # by the refresh token grant, not a new sign-on
    wait_past(claims_of(first)["exp"] + 1)
    assert _whoami_status(browser) == 200  # past the first token's exp the page still works
    _click(browser, "#nav a[href='#/queues']")
    _wait(lambda: browser.find_elements("css selector", "#nav a[href='#/queues'].active"), "the queues page")
    assert not browser.find_elements("css selector", "#sso-expiring")
    assert _text(browser, "#whoami") == "sso-refresher (administrator)"  # not sent back to the login form


def test_without_a_refresh_token_the_dashboard_prompts_to_sign_in_again(ob: OAuthBroker, provider: OIDCProvider,
                                                                       browser: Any) -> None:
    provider.add_client("dashboard", SCOPES, lifetime=6, redirect_uris=[f"{ob.broker.http_url}/"])
    first = _sign_in(ob, provider, browser, "sso-prompted")
    _wait(lambda: browser.find_elements("css selector", "#sso-expiring"), "the prompt to sign in again", 10)
    assert _whoami_status(browser) == 200  # prompted while the token still holds
    provider.clients["dashboard"].lifetime = 300
    _click(browser, "#sso-renew")
    _wait(lambda: browser.current_url.startswith(f"{provider.issuer}/authorize?"), "the provider's login page")
    _fill(browser, "#username", "sso-prompted")
    _click(browser, "#sign-in")
    _wait(lambda: _text(browser, "#whoami") == "sso-prompted (administrator)", "signed in again")
    second = browser.execute_script("return sessionStorage.getItem('lavinpy.token')")
    assert second != first and claims_of(second)["exp"] > claims_of(first)["exp"]
    assert not browser.find_elements("css selector", "#sso-expiring")
