// lavinpy dashboard: single sign-on (RabbitMQ's management.oauth_*): the OAuth 2.0 authorization code
// flow with PKCE (RFC 7636, S256) as a public client. The login page asks /api/auth whether it is on;
// "Sign in with SSO" reads the provider's OpenID discovery document, sends the browser to its
// authorization endpoint with a fresh code verifier's challenge and a state, and on the way back
// exchanges the code (with the verifier) at its token endpoint. The access token is kept in
// sessionStorage (this tab only) and sent as Bearer; the broker checks it like any token (oauth2).
// Before it expires (a third of its life left, at most a minute) the page gets a new one with the
// refresh token grant when the provider gave a refresh token; else (or if that fails) it shows a
// prompt to sign in again, before the API starts refusing the old token.
"use strict";

const SSO_KEY = "lavinpy.sso";  // the verifier, state and token endpoint of a sign-on under way
const RENEW_KEY = "lavinpy.sso.renew";  // {refreshToken, tokenEndpoint, expiresAt (ms)} of the signed-in token
let ssoSettings = null;
let renewTimer = null;

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
  keepToken(answer, pending.tokenEndpoint);
  return true;
}

// The token's expiry: its exp claim (the broker's view), else the token endpoint's expires_in.
function tokenExpiry(token, expiresIn) {
  try {
    const claims = JSON.parse(atob(token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/")));
    if (typeof claims.exp === "number") return claims.exp * 1000;
  } catch (e) { /* not a JWT the page can read */ }
  return expiresIn ? Date.now() + expiresIn * 1000 : null;
}

function keepToken(answer, tokenEndpoint) {
  const previous = JSON.parse(sessionStorage.getItem(RENEW_KEY) || "null") || {};
  sessionStorage.setItem(TOKEN_KEY, answer.access_token);
  sessionStorage.setItem(RENEW_KEY, JSON.stringify({
    refreshToken: answer.refresh_token || (answer.grant === "refresh_token" ? previous.refreshToken : null) || null,
    tokenEndpoint, expiresAt: tokenExpiry(answer.access_token, answer.expires_in),
  }));
  const prompt = document.getElementById("sso-expiring");
  if (prompt) prompt.remove();
  scheduleRenewal();
}

function scheduleRenewal() {
  clearTimeout(renewTimer);
  const state = JSON.parse(sessionStorage.getItem(RENEW_KEY) || "null");
  if (!state || !state.expiresAt || !sessionStorage.getItem(TOKEN_KEY)) return;
  const left = state.expiresAt - Date.now();
  renewTimer = setTimeout(() => renewToken(state).catch((e) => promptSignIn(state, e.message)),
                          Math.max(0, left - Math.min(60000, left / 3)));
}

async function renewToken(state) {
  if (!sessionStorage.getItem(TOKEN_KEY)) return;  // logged out meanwhile
  if (!state.refreshToken) { promptSignIn(state, ""); return; }
  const settings = await ssoConfig();
  const resp = await fetch(state.tokenEndpoint, {
    method: "POST", credentials: "omit", headers: { "Content-Type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ grant_type: "refresh_token", refresh_token: state.refreshToken,
                                client_id: settings.oauth_client_id }),
  });
  const answer = await resp.json().catch(() => ({}));
  if (!resp.ok || !answer.access_token) throw new Error(answer.error_description || answer.error || "HTTP " + resp.status);
  keepToken({ ...answer, grant: "refresh_token" }, state.tokenEndpoint);
}

// No refresh token (or it was refused): the user is asked to sign in again before the token runs out.
function promptSignIn(state, why) {
  if (!sessionStorage.getItem(TOKEN_KEY) || document.getElementById("sso-expiring")) return;
  const at = new Date(state.expiresAt).toLocaleTimeString();
  const button = h("button", { type: "button", id: "sso-renew" }, "Sign in again");
  button.addEventListener("click", async () => {
    try { await startSso(await ssoConfig()); } catch (e) { flash("Single sign-on failed: " + e.message); }
  });
  document.body.prepend(h("div", { id: "sso-expiring", className: "alarm" },
    "Your single sign-on ends at " + at + (why ? " (it could not be renewed: " + why + ")" : "") + ". ", button));
}

document.addEventListener("DOMContentLoaded", scheduleRenewal);  // a reload keeps the renewal going
