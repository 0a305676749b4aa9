"""Who may call the API: bearer tokens with scopes, and a per-token rate limit.

Tokens are configured as SHA-256 hashes (`bandgate token new` makes one), so the settings
never hold a usable secret and nothing here logs one. Scopes: `publish:<queue>`,
`read:<queue>` (stats), `consume:<queue>` (receive and settle over HTTP, `bandgate.pull`),
`admin` (everything, dead-letter operations included); `*` stands for
any queue. The middleware answers 401 and 429; handlers check scopes and answer 403.

Rate limits count messages: every request costs one, and a batch handler charges the rest of
its messages (`charge`) before it publishes any. Failed authentications are limited per client
address: past the limit, that address gets 429 before its token is even looked at.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from bandgate.core import error_codes
from bandgate.gateway.errors import ApiError, count_rejected, error_response

Action = Literal["publish", "read", "consume"]
SCOPE = re.compile(r"^(admin|(publish|read|consume):(\*|[A-Za-z0-9][A-Za-z0-9_-]{0,63}))$")


class TokenSpec(BaseModel):
    """One API token as configured: its name, the SHA-256 of the secret, its scopes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    scopes: tuple[str, ...]
    rate_per_second: float | None = Field(default=None, gt=0)

    @field_validator("scopes")
    @classmethod
    def _scopes_valid(cls, scopes: tuple[str, ...]) -> tuple[str, ...]:
        for scope in scopes:
            if not SCOPE.fullmatch(scope):
                raise ValueError(
                    f"scope {scope!r} is invalid: use publish:<queue>, read:<queue>, "
                    "consume:<queue> (queue or *) or admin"
                )
        return scopes


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "bg_" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    name: str
    scopes: frozenset[str]
    rate_per_second: float | None = None

    def may(self, action: Action, queue: str) -> bool:
        return bool({"admin", f"{action}:*", f"{action}:{queue}"} & self.scopes)


ANONYMOUS = Principal("anonymous (auth disabled)", frozenset({"admin"}))


@dataclass
class TokenBucket:
    rate: float
    burst: float
    tokens: float = field(init=False)
    updated: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def take(self, cost: float = 1) -> float:
        """0 when `cost` tokens were taken, else the seconds until they could be (none taken).

        A cost above the burst passes on a full bucket and leaves it in debt, so a batch
        larger than the burst is slowed to the rate instead of refused for ever."""
        wait = self.wait(cost)
        if wait == 0:
            self.tokens -= cost
        return wait

    def wait(self, cost: float = 1) -> float:
        """The seconds until `cost` tokens (at most a full bucket) are there; takes none."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        needed = min(cost, self.burst)
        return 0.0 if self.tokens >= needed else (needed - self.tokens) / self.rate


MAX_TRACKED_ADDRESSES = 10_000


class Authenticator:
    def __init__(
        self,
        tokens: tuple[TokenSpec, ...],
        enabled: bool = True,
        rate_per_second: float | None = None,
        burst: int = 100,
        failures_per_minute: int = 60,
    ) -> None:
        self.enabled = enabled
        self._by_hash = {
            spec.sha256: Principal(spec.name, frozenset(spec.scopes), spec.rate_per_second)
            for spec in tokens
        }
        self._default_rate = rate_per_second
        self._burst = burst
        self._buckets: dict[str, TokenBucket] = {}
        self._failures_per_minute = failures_per_minute
        self._failures: OrderedDict[str, TokenBucket] = OrderedDict()

    def authenticate(self, authorization: str | None, client: str = "-") -> Principal:
        """The principal of a bearer token, or 401; 429 for an address that failed too often."""
        if not self.enabled:
            return ANONYMOUS
        failures = self._failures.get(client)
        if failures is not None and (wait := failures.wait()) > 0:
            raise ApiError.of(
                error_codes.TOO_MANY_AUTH_FAILURES,
                f"over {self._failures_per_minute} failed authentications a minute from this "
                "address",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )  # fmt: skip
        if not authorization:
            self._failed(client)
            raise ApiError.of(
                error_codes.UNAUTHORIZED, "send Authorization: Bearer <token>",
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
        scheme, _, token = authorization.partition(" ")
        principal = (
            self._by_hash.get(hash_token(token.strip())) if scheme.lower() == "bearer" else None
        )
        if principal is None:
            self._failed(client)
            raise ApiError.of(
                error_codes.INVALID_TOKEN, "the bearer token is not valid",
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )  # fmt: skip
        return principal

    def _failed(self, client: str) -> None:
        """Count a failed authentication against the client's address (at most
        `MAX_TRACKED_ADDRESSES` are remembered, the least recently failing forgotten first)."""
        bucket = self._failures.get(client)
        if bucket is None:
            per_minute = self._failures_per_minute
            bucket = self._failures[client] = TokenBucket(per_minute / 60, per_minute)
            if len(self._failures) > MAX_TRACKED_ADDRESSES:
                self._failures.popitem(last=False)
        else:
            self._failures.move_to_end(client)
        bucket.take(1)

    def admit(self, principal: Principal, cost: int = 1) -> None:
        """Take `cost` messages from the principal's rate limit, or raise 429 with
        Retry-After (taking none)."""
        rate = principal.rate_per_second or self._default_rate
        if not rate:
            return
        bucket = self._buckets.get(principal.name)
        if bucket is None:
            bucket = self._buckets[principal.name] = TokenBucket(rate, max(self._burst, 1))
        wait = bucket.take(cost)
        if wait > 0:
            raise ApiError.of(
                error_codes.RATE_LIMITED, f"over {rate:g} messages/s for token {principal.name!r}",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )  # fmt: skip


class AuthMiddleware:
    """Authenticate every `/v1/` request and apply rate limits before any handler runs."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self.app = app
        self.authenticator = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        authorization = _authorization(scope)
        try:
            principal = self.authenticator.authenticate(authorization, client[0] if client else "-")
            scope.setdefault("state", {})["principal"] = principal  # its 429s count under it
            self.authenticator.admit(principal)
        except ApiError as error:
            count_rejected(Request(scope), error.code)
            await error_response(error)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _authorization(scope: Scope) -> str | None:
    """The first Authorization header, as Starlette's `Request.headers` reads it (latin-1),
    off the scope: a `Request` and its header map per call cost each publish 2-3 us."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return bytes(value).decode("latin-1")
    return None


def charge(request: Request, messages: int) -> None:
    """Charge a request's further messages (beyond the one its request cost) to its token's
    rate limit; 429 when over it."""
    if messages > 0:
        authenticator: Authenticator = request.app.state.authenticator
        authenticator.admit(request.state.principal, messages)


def authorize(request: Request, action: Action | Literal["admin"], queue: str = "*") -> None:
    """Raise 403 unless the request's principal may do `action` on `queue`."""
    principal: Principal = request.state.principal
    allowed = "admin" in principal.scopes if action == "admin" else principal.may(action, queue)
    if not allowed:
        needed = "admin" if action == "admin" else f"{action}:{queue}"
        raise ApiError.of(error_codes.FORBIDDEN, f"token {principal.name!r} lacks scope {needed!r}")
