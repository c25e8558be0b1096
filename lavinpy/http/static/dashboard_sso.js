// lavinpy dashboard: single sign-on (RabbitMQ's management.oauth_*): the OAuth 2.0 authorization code
// flow with PKCE (RFC 7636, S256) as a public client. The login page asks /api/auth whether it is on;
// "Sign in with SSO" reads the provider's OpenID discovery document, sends the browser to its
// authorization endpoint with a fresh code verifier's challenge and a state, and on the way back
// exchanges the code (with the verifier) at its token endpoint. The access token is kept in
// sessionStorage (this tab only) and sent as Bearer; the broker checks it like any token (oauth2).
"use strict";

const SSO_KEY = "lavinpy.sso";  // the verifier, state and token endpoint of a sign-on under way
let ssoSettings = null;

function b64url(bytes) {
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

async function ssoConfig() {
  if (ssoSettings === null) {
    try {
      const resp = await fetch("/api/auth", { credentials: "omit" });
      ssoSettings = resp.ok ? await resp.json() : { oauth_enabled: false };
    } catch (e) {
      ssoSettings = { oauth_enabled: false };
    }
  }
  return ssoSettings;
}

async function discovery(settings) {
  const resp = await fetch(settings.oauth_provider_url + "/.well-known/openid-configuration", { credentials: "omit" });
  if (!resp.ok) throw new Error("the provider's discovery document: HTTP " + resp.status);
  return resp.json();
}

const redirectUri = () => location.origin + location.pathname;

async function offerSso(form) {
  if (!form || form.querySelector(".sso")) return;
  const settings = await ssoConfig();
  if (!settings.oauth_enabled || form.querySelector(".sso")) return;
  const button = h("button", { type: "button", className: "sso", id: "sso-login" }, "Sign in with SSO");
  button.addEventListener("click", () => startSso(settings).catch((e) => flash("Single sign-on failed: " + e.message)));
  form.append(h("p", {}, button));
}

async function startSso(settings) {
  const provider = await discovery(settings);
  const verifier = b64url(crypto.getRandomValues(new Uint8Array(32)));
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier));
  const state = b64url(crypto.getRandomValues(new Uint8Array(16)));
  sessionStorage.setItem(SSO_KEY, JSON.stringify({ verifier, state, tokenEndpoint: provider.token_endpoint }));
  const query = new URLSearchParams({
    response_type: "code", client_id: settings.oauth_client_id, redirect_uri: redirectUri(),
    scope: settings.oauth_scopes, state, code_challenge: b64url(new Uint8Array(digest)),
    code_challenge_method: "S256",
  });
  location.assign(provider.authorization_endpoint + "?" + query);
}

// Back from the provider (?code=...&state=... or ?error=...): true once a token is stored.
async function finishSso() {
  const params = new URLSearchParams(location.search);
  if (!params.has("code") && !params.has("error")) return false;
  const pending = JSON.parse(sessionStorage.getItem(SSO_KEY) || "null");
  sessionStorage.removeItem(SSO_KEY);
  history.replaceState(null, "", redirectUri() + location.hash);  // the code is used once, never shown again
  if (params.has("error")) { flash("Single sign-on refused: " + (params.get("error_description") || params.get("error"))); return false; }
  if (!pending || pending.state !== params.get("state")) { flash("Single sign-on failed: unexpected answer (state)"); return false; }
  const settings = await ssoConfig();
  const resp = await fetch(pending.tokenEndpoint, {
    method: "POST", credentials: "omit", headers: { "Content-Type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ grant_type: "authorization_code", code: params.get("code"), redirect_uri: redirectUri(),
                                client_id: settings.oauth_client_id, code_verifier: pending.verifier }),
  });
  const answer = await resp.json().catch(() => ({}));
  if (!resp.ok || !answer.access_token) {
    flash("Single sign-on failed: " + (answer.error_description || answer.error || resp.status));
    return false;
  }
  sessionStorage.setItem(TOKEN_KEY, answer.access_token);
  return true;
}
