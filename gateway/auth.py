"""Who may call the API: bearer tokens with scopes, and a per-token rate limit.

Tokens are configured as SHA-256 hashes (`bandgate token new` makes one), so the settings
never hold a usable secret and nothing here logs one. Scopes: `publish:<queue>`,
`read:<queue>` (stats), `admin` (everything, dead-letter operations included); `*` stands for
any queue. The middleware answers 401 and 429; handlers check scopes and answer 403.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import ApiError, count_rejected, error_response

Action = Literal["publish", "read"]
SCOPE = re.compile(r"^(admin|(publish|read):(\*|[A-Za-z0-9][A-Za-z0-9_-]{0,63}))$")


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
                    f"scope {scope!r} is invalid: use publish:<queue>, read:<queue> "
                    "(queue or *) or admin"
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

    def take(self) -> float:
        """0 when a request may pass, else the seconds until it could."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class Authenticator:
    def __init__(
        self,
        tokens: tuple[TokenSpec, ...],
        enabled: bool = True,
        rate_per_second: float | None = None,
        burst: int = 100,
    ) -> None:
        self.enabled = enabled
        self._by_hash = {
            spec.sha256: Principal(spec.name, frozenset(spec.scopes), spec.rate_per_second)
            for spec in tokens
        }
        self._default_rate = rate_per_second
        self._burst = burst
        self._buckets: dict[str, TokenBucket] = {}

    def authenticate(self, authorization: str | None) -> Principal:
        if not self.enabled:
            return ANONYMOUS
        if not authorization:
            raise ApiError(
                401, "unauthorized", "send Authorization: Bearer <token>",
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
        scheme, _, token = authorization.partition(" ")
        principal = (
            self._by_hash.get(hash_token(token.strip())) if scheme.lower() == "bearer" else None
        )
        if principal is None:
            raise ApiError(
                401, "invalid_token", "the bearer token is not valid",
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )  # fmt: skip
        return principal

    def admit(self, principal: Principal) -> None:
        """Apply the principal's rate limit; raise 429 with Retry-After when over it."""
        rate = principal.rate_per_second or self._default_rate
        if not rate:
            return
        bucket = self._buckets.get(principal.name)
        if bucket is None:
            bucket = self._buckets[principal.name] = TokenBucket(rate, max(self._burst, 1))
        wait = bucket.take()
        if wait > 0:
            raise ApiError(
                429, "rate_limited", f"over {rate:g} requests/s for token {principal.name!r}",
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
        request = Request(scope)
        try:
            principal = self.authenticator.authenticate(request.headers.get("authorization"))
            self.authenticator.admit(principal)
        except ApiError as error:
            count_rejected(request, error.code)
            await error_response(error)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


def authorize(request: Request, action: Action | Literal["admin"], queue: str = "*") -> None:
    """Raise 403 unless the request's principal may do `action` on `queue`."""
    principal: Principal = request.state.principal
    allowed = "admin" in principal.scopes if action == "admin" else principal.may(action, queue)
    if not allowed:
        needed = "admin" if action == "admin" else f"{action}:{queue}"
        raise ApiError(403, "forbidden", f"token {principal.name!r} lacks scope {needed!r}")
