"""The console's protections, as plain ASGI middleware and helpers (docs/console.md).

* **Access token**, always (on loopback too: any local user or process could otherwise read
  the federation and start rounds signed with the coordinator's key). Every request but the
  static assets and the login form's POST must carry it: as ``Authorization: Bearer TOKEN``,
  or in the session cookie (``dpfed_console_PORT``: HttpOnly, SameSite=Strict, Path=/, Secure
  over HTTPS) that the login form or a visit to any page with ``?token=TOKEN`` sets. Such a
  visit is answered with a redirect to the same address without the token, so it does not
  stay in the history nor go out in a Referer. Without it: 401 and a short page saying how
  to log in (no data). Compared in constant time (``hmac.compare_digest`` of SHA-256
  digests, so not even the length leaks).
* **Host check** on a loopback bind: only ``127.0.0.1``, ``localhost`` and ``[::1]`` (with the
  port) are served, so a web page that rebinds its own name to 127.0.0.1 (DNS rebinding) cannot
  read the console.
* **CSRF**: every POST must come from the console's own pages: the ``Origin`` header, when
  sent, must be the console's own, and the form must carry the value of the ``dpfed_csrf``
  cookie (double submit; SameSite=Strict). Starting a round is signed with the coordinator's
  key: no other site may make a browser do it.
* **Headers** on every answer: a Content-Security-Policy allowing only the console's own
  scripts, styles and images (no inline script, no CDN), no framing, no referrer to other
  sites, no sniffing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from http.cookies import SimpleCookie
from urllib.parse import parse_qs, parse_qsl, quote, urlencode, urlsplit

from dpfed_apps.console.config import is_loopback

# The session cookie's name is this plus the port: cookies do not tell ports apart, and two
# consoles on one host (dpfed console and dpfed simulate --console) must not log each other
# out, nor send one's token to the other.
TOKEN_COOKIE = "dpfed_console"
TOKEN_QUERY = "token"
# Set in the ASGI scope of a request that carried the token (pages then show who is signed in).
AUTHENTICATED = "dpfed.authenticated"
CSRF_COOKIE = "dpfed_csrf"
CSRF_FIELD = "csrf"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
# Served without the token: the static assets (the console's own script and style, no data;
# the login page needs its style) and the login form's POST (which checks the token itself).
PUBLIC_PREFIX = "/static/"
LOGIN_PATH = "/login"
HOW_TO_LOG_IN = ("This console requires its access token: open the address with ?token=... "
                 "that `dpfed console` (or `dpfed simulate --console`) printed when it started, "
                 "or send the header Authorization: Bearer TOKEN.")

SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
     b"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    # same-origin, not no-referrer: under no-referrer Chromium sends "Origin: null" with the
    # console's own form posts, which the CSRF check must then refuse.
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


def same_secret(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison of two secrets (False when either is missing)."""
    if not given or not expected:
        return False
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(),
                               hashlib.sha256(expected.encode()).digest())


def new_csrf_token() -> str:
    return secrets.token_urlsafe(24)


def _headers(scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope.get("headers", [])}


def cookies(scope) -> dict[str, str]:
    raw = _headers(scope).get(b"cookie", b"").decode("latin-1")
    jar = SimpleCookie()
    try:
        jar.load(raw)
    except Exception:  # noqa: BLE001 - a malformed cookie header reads as no cookies
        return {}
    return {k: m.value for k, m in jar.items()}


def bearer(scope) -> str | None:
    auth = _headers(scope).get(b"authorization", b"").decode("latin-1")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return None


def token_cookie(scope) -> str:
    """The session cookie's name for the console serving ``scope`` (TOKEN_COOKIE)."""
    server = scope.get("server") or (None, None)
    return f"{TOKEN_COOKIE}_{server[1]}" if server[1] else TOKEN_COOKIE


def session_cookie(scope, token: str, *, secure: bool) -> str:
    """The Set-Cookie value that logs a browser in: HttpOnly, SameSite=Strict, Path=/, and
    Secure over HTTPS; a session cookie (no expiry)."""
    jar = SimpleCookie()
    name = token_cookie(scope)
    jar[name] = token
    morsel = jar[name]
    morsel["httponly"] = True
    morsel["samesite"] = "Strict"
    morsel["path"] = "/"
    if secure:
        morsel["secure"] = True
    return morsel.OutputString()


def query_token(scope) -> str | None:
    """The ``token`` parameter of the request's query string, if any."""
    query = scope.get("query_string", b"").decode("latin-1")
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == TOKEN_QUERY:
            return value
    return None


def without_token(scope) -> str:
    """The request's own address (path and query) without the ``token`` parameter: where a
    visit with ``?token=`` is sent once the cookie is set."""
    raw_path = scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else quote(scope.get("path", "/"))
    query = [(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                          keep_blank_values=True) if k != TOKEN_QUERY]
    path = safe_next(path)
    return f"{path}?{urlencode(query)}" if query else path


def allowed_host(host_header: str, port: int) -> bool:
    """Whether a loopback-bound console serves a request with this Host header."""
    host = host_header.strip().lower()
    return host in {f"{name}:{port}" for name in LOOPBACK_NAMES} | set(LOOPBACK_NAMES)


def _plain(status: int, text: str):
    body = text.encode()
    return status, [(b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode())], body


class Guard:
    """ASGI middleware: host check, access token, security headers (module docstring).
    ``port``: the port actually bound (for the host check), set once listening.
    ``login_page(next_path, message) -> (status, headers, body)``: the page a GET without the
    token gets (with status 401), saying how to log in and showing no data."""

    def __init__(self, app, *, token: str, loopback: bool, tls: bool, login_page=None):
        if not token:
            raise ValueError("the console always requires an access token (config.with_token)")
        self.app = app
        self.token = token
        self.loopback = loopback
        self.tls = tls
        self.port: int | None = None
        self.login_page = login_page

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        path = scope.get("path", "/")
        method = scope.get("method", "GET")
        static = path.startswith(PUBLIC_PREFIX)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                if static:   # the console's own script and style: no data, may be cached
                    present.add(b"cache-control")
                    message["headers"] = list(message.get("headers", [])) + [
                        (b"cache-control", b"private, max-age=3600")]
                message["headers"] = list(message.get("headers", [])) + [
                    (k, v) for k, v in SECURITY_HEADERS if k not in present]
            await send(message)

        if self.loopback and self.port is not None:
            host = _headers(scope).get(b"host", b"").decode("latin-1")
            if not allowed_host(host, self.port):
                return await self._respond(send_with_headers, *_plain(
                    421, "This console answers only to 127.0.0.1, localhost and [::1]."))
        if static or (path == LOGIN_PATH and method == "POST"):
            return await self.app(scope, receive, send_with_headers)
        in_query = query_token(scope) if method in ("GET", "HEAD") else None
        if in_query is not None:
            if same_secret(in_query, self.token):
                # Log the browser in and send it to the same page without the token.
                return await self._respond(send_with_headers, 303, [
                    (b"location", without_token(scope).encode("latin-1")),
                    (b"set-cookie", session_cookie(scope, self.token,
                                                   secure=self.tls).encode("latin-1")),
                    (b"content-length", b"0")], b"")
            return await self._refuse(scope, send_with_headers, path, method,
                                      "That is not this console's access token.")
        given = bearer(scope) or cookies(scope).get(token_cookie(scope))
        if not same_secret(given, self.token):
            message = ("" if given is None else
                       "That is not this console's access token (a console without "
                       "token_file makes a new one each time it starts).")
            return await self._refuse(scope, send_with_headers, path, method, message)
        scope[AUTHENTICATED] = True
        return await self.app(scope, receive, send_with_headers)

    async def _refuse(self, scope, send, path, method, message):
        """401 with a short page saying how to log in: the login form for a GET, plain text
        otherwise. No data, no traceback."""
        if self.login_page is not None and method == "GET":
            status, headers, body = self.login_page(path, message)
        else:
            status, headers, body = _plain(401, (message + " " if message else "")
                                           + HOW_TO_LOG_IN)
            if method == "HEAD":
                body = b""
        headers = list(headers) + [(b"www-authenticate", b'Bearer realm="dpfed console"')]
        return await self._respond(send, 401, headers, body)

    @staticmethod
    async def _respond(send, status, headers, body):
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def origin_ok(headers, scheme: str) -> bool:
    """A POST's Origin (when sent) must be the console itself: same scheme and host:port."""
    origin = headers.get("origin")
    if origin is None:
        return True          # older clients send none; the CSRF token still decides
    host = headers.get("host", "")
    parts = urlsplit(origin)
    return parts.scheme == scheme and parts.netloc.lower() == host.lower()


def csrf_ok(cookie_value: str | None, form_value: str | None) -> bool:
    return same_secret(form_value, cookie_value)


def safe_next(path: str) -> str:
    """Where the login form may send a person back to: a path of this console only (not the
    login form itself)."""
    if (not path.startswith("/") or path.startswith("//") or "\\" in path
            or urlsplit(path).path == LOGIN_PATH):
        return "/"
    return path


def login_token(body: bytes) -> tuple[str | None, str]:
    """(token, next) from the login form's urlencoded body."""
    form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
    return (form.get("token") or [None])[0], safe_next((form.get("next") or ["/"])[0])
