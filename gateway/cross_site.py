"""Who may drive the gateway from a browser: nobody from another site, and, where the gateway
names the hosts it serves (`bandgate dev`), no page through a host name of its own.

A page on another origin can send a request without a CORS preflight when it looks like a
form: a POST without a body (`fetch(url, {method: "POST", mode: "no-cors"})`) replayed a whole
DLQ this way against `bandgate dev`, whose authentication is off. Requiring a JSON
Content-Type on every state-changing route would stop that, and break every client that sends
a body-less `DELETE` or `POST` without one (the README's curl commands). The rule here stops
the same requests and no client that is not a browser: a browser names the page's origin in
`Origin` on every request that is not a GET or HEAD (the Fetch standard; `null` from an opaque
origin), and on every request in `Sec-Fetch-Site`; curl, httpx and the worker library send
neither. So a request is refused (403 `cross_site_request`) when

- its method changes state (anything but GET, HEAD, OPTIONS) and its `Origin` is not the
  gateway's own (the `Host` it was sent to) nor one of `BANDGATE_ALLOWED_ORIGINS`; or
- `Sec-Fetch-Site` says `cross-site` or `same-site`, unless it is a GET the user navigated to
  (a link to the console).

DNS rebinding makes the attacker's host name resolve to the gateway's address: then `Origin`
and `Host` agree. Only the `Host` itself tells, so when `BANDGATE_ALLOWED_HOSTS` is set (`bandgate
dev` sets its own address and the loopback names) any other `Host` is refused (403
`host_not_allowed`).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from bandgate.core import error_codes
from bandgate.gateway.errors import ApiError, error_response

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def local_hosts(bound: str) -> tuple[str, ...]:
    """The hosts a gateway bound to `bound` serves a browser on this machine under."""
    extra = () if bound in _WILDCARDS or bound in LOOPBACK_HOSTS else (bound,)
    return (*LOOPBACK_HOSTS, *extra)


def host_name(host: str) -> str:
    """`Host` without its port, lower case (`[::1]:8000` is `::1`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class CrossSiteGuard:
    """Refuse cross-site browser requests and, when `allowed_hosts` is not empty, requests
    to other hosts (the module docstring says why)."""

    def __init__(
        self,
        app: ASGIApp,
        allowed_hosts: tuple[str, ...] = (),
        allowed_origins: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.allowed_hosts = frozenset(host_name(host) for host in allowed_hosts)
        self.allowed_origins = frozenset(origin.rstrip("/").lower() for origin in allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> ApiError | None:
        host = origin = fetch_site = fetch_mode = ""
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"sec-fetch-site":
                fetch_site = value.decode("latin-1").lower()
            elif name == b"sec-fetch-mode":
                fetch_mode = value.decode("latin-1").lower()
        if self.allowed_hosts and host_name(host) not in self.allowed_hosts:
            return ApiError.of(
                error_codes.HOST_NOT_ALLOWED,
                f"this gateway does not serve the host {host_name(host)[:100]!r}",
            )
        method = scope["method"]
        if fetch_site in ("cross-site", "same-site") and not (
            method == "GET" and fetch_mode == "navigate"
        ):
            return _cross_site(f"a {fetch_site} request from a browser")
        if origin and method not in SAFE_METHODS and not self._own(origin, host):
            return _cross_site(f"a {method} from the origin {origin[:100]!r}")
        return None

    def _own(self, origin: str, host: str) -> bool:
        origin = origin.strip().lower()
        if origin in self.allowed_origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host.lower()


def _cross_site(what: str) -> ApiError:
    return ApiError.of(
        error_codes.CROSS_SITE_REQUEST,
        f"{what} is refused: no web page of another site may drive the gateway "
        "(BANDGATE_ALLOWED_ORIGINS names the pages that may)",
    )
