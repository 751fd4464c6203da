"""Who may use the dashboard, and proof that an action came from its own pages.

Authentication is a bearer token or basic-auth credentials, each read from a file
(never from the command line, where ``ps`` shows it). A browser signs in with the
token once (``/login``) and then carries a session cookie: an HMAC of the token, so
it survives restarts and dies with the token. Every POST carries a CSRF token, an
HMAC of a random per-browser cookie under a key derived from the credentials, and
a POST whose ``Origin`` (or ``Sec-Fetch-Site``) says another site sent it is refused.
Comparisons are constant-time. Responses carry a strict Content-Security-Policy.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ConfigError

SESSION_COOKIE = "sq_session"
CSRF_COOKIE = "sq_csrf"
#: Paths open without credentials.
OPEN_PATHS = ("/login", "/healthz", "/static/")

HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                               "script-src 'self'; connect-src 'self'; frame-ancestors 'none'; "
                               "form-action 'self'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def read_secret(path: str, what: str) -> str:
    """The first line of file ``path``; ConfigError (naming the path, never the
    content) when it is missing or empty."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise ConfigError(f"cannot read the {what} file {path!r}: {why}") from None
    line = text.splitlines()[0].strip() if text.strip() else ""
    if not line:
        raise ConfigError(f"the {what} file {path!r} is empty")
    return line


def read_basic(path: str) -> tuple[str, str]:
    """``user:password`` from the first line of ``path``."""
    line = read_secret(path, "basic-auth")
    user, sep, password = line.partition(":")
    if not sep or not user or not password:
        raise ConfigError(f"the basic-auth file {path!r} must hold one line 'user:password'")
    return user, password


class Guard:
    """The dashboard's credentials and the keys derived from them."""

    def __init__(self, token: str | None = None, basic: tuple[str, str] | None = None) -> None:
        self.token, self.basic = token, basic
        material = token or (":".join(basic) if basic else None)
        self._key = (hashlib.sha256(b"streamq-web|" + material.encode()).digest()
                     if material is not None else secrets.token_bytes(32))

    @property
    def open(self) -> bool:
        """No credentials asked (``--no-auth``)."""
        return self.token is None and self.basic is None

    def _mac(self, what: str) -> str:
        return hmac.new(self._key, what.encode(), hashlib.sha256).hexdigest()

    def session_value(self) -> str:
        """The session cookie's value after a sign-in with the token."""
        return self._mac("session")

    def check_token(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(),
                                                              self.token.encode())

    def authenticated(self, headers: dict[str, str], cookies: dict[str, str]) -> bool:
        """Whether a request with these headers and cookies may read."""
        if self.open:
            return True
        auth = headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if self.token is not None:
            if scheme.lower() == "bearer" and self.check_token(value.strip()):
                return True
            session = cookies.get(SESSION_COOKIE, "")
            return bool(session) and hmac.compare_digest(session.encode(),
                                                         self.session_value().encode())
        assert self.basic is not None
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(value.strip(), validate=True).decode(
                "utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        ok_user = hmac.compare_digest(user.encode(), self.basic[0].encode())
        ok_password = hmac.compare_digest(password.encode(), self.basic[1].encode())
        return ok_user and ok_password

    def csrf_token(self, browser: str) -> str:
        """The CSRF token for a browser's ``sq_csrf`` cookie value."""
        return self._mac("csrf|" + browser)

    def csrf_ok(self, browser: str, given: str) -> bool:
        return bool(browser) and bool(given) and hmac.compare_digest(
            given.encode(), self.csrf_token(browser).encode())


def new_browser_id() -> str:
    return secrets.token_urlsafe(24)


def same_origin(headers: dict[str, str]) -> bool:
    """False when the browser says another site sent the request."""
    if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = headers.get("origin")
    if origin is None:
        return True
    if origin == "null":  # an opaque origin (a sandboxed frame, a data: page)
        return False
    host = headers.get("host", "")
    return urlsplit(origin).netloc.lower() == host.lower()
