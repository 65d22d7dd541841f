"""The dashboard's side of the token rule: a session cookie set by the login page.

A browser cannot add ``Authorization: Bearer`` to a page it navigates to, so the login page
takes the token once and sets an HttpOnly, SameSite=Strict cookie holding an HMAC of it (never
the token itself). The API's auth middleware accepts that cookie wherever it accepts the bearer
token; a request that changes something must also carry the ``X-Dyntrain-Dashboard`` header
(which a cross-site form cannot send), and a dashboard page asked for without credentials
redirects to the login page instead of answering 401 JSON.
"""

from __future__ import annotations

import hashlib
import hmac
from http.cookies import SimpleCookie
from urllib.parse import quote

from starlette.types import Scope

COOKIE = "dyntrain_session"
ACTION_HEADER = b"x-dyntrain-dashboard"
LOGIN_PATH = "/ui/login"
STATIC_PREFIX = "/ui/static/"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def session_value(token: str) -> str:
    """What the cookie holds for ``token``: an HMAC, so the cookie never reveals the token."""
    return hmac.new(token.encode(), b"dyntrain dashboard session v1", hashlib.sha256).hexdigest()


def is_open(path: str) -> bool:
    """Paths that reveal nothing about the service: the login page and the static assets."""
    return path == LOGIN_PATH or path.startswith(STATIC_PREFIX)


def is_page(path: str) -> bool:
    return path == "/" or (path.startswith("/ui/") and not path.startswith("/ui/data/")
                           and not path.startswith("/ui/part/"))


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return None


def cookie_grants(scope: Scope, token: str) -> bool:
    """True when the request carries the session cookie for ``token`` (and, for a request that
    changes something, the dashboard's action header)."""
    raw = _header(scope, b"cookie")
    if raw is None:
        return False
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw.decode("latin-1"))
    except Exception:  # a malformed Cookie header grants nothing
        return False
    morsel = jar.get(COOKIE)
    if morsel is None or not hmac.compare_digest(morsel.value.encode(),
                                                 session_value(token).encode()):
        return False
    return scope.get("method", "GET") in SAFE_METHODS or _header(scope, ACTION_HEADER) is not None


def login_redirect(scope: Scope) -> str | None:
    """Where to send a browser that asked for a dashboard page without credentials (None: the
    request is not for a page, and gets the API's 401)."""
    if scope.get("method") not in ("GET", "HEAD") or not is_page(scope["path"]):
        return None
    if _header(scope, b"authorization") is not None:
        return None  # a client that sent a (wrong) token learns that it was wrong
    target = scope["path"]
    query = scope.get("query_string", b"").decode("latin-1")
    if query:
        target += "?" + query
    return f"{LOGIN_PATH}?next={quote(target, safe='')}"
