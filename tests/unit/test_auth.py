from __future__ import annotations

import pydantic
import pytest

from bandgate.gateway.auth import (
    Authenticator,
    Principal,
    TokenBucket,
    TokenSpec,
    hash_token,
    new_token,
)
from bandgate.gateway.errors import ApiError


def test_tokens_are_random_and_hashed() -> None:
    first, second = new_token(), new_token()
    assert first != second
    assert len(hash_token(first)) == 64
    assert hash_token(first) != first


@pytest.mark.parametrize("scope", ["publish", "read:", "write:orders", "publish:a.b", "admin:x"])
def test_bad_scopes_are_refused(scope: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="scope"):
        TokenSpec(name="t", sha256="0" * 64, scopes=(scope,))


def test_scopes_per_queue_and_wildcards() -> None:
    principal = Principal("p", frozenset({"publish:orders", "read:*"}))
    assert principal.may("publish", "orders")
    assert not principal.may("publish", "emails")
    assert principal.may("read", "emails")
    assert Principal("a", frozenset({"admin"})).may("publish", "anything")


def test_authenticator_finds_tokens_by_hash_only() -> None:
    spec = TokenSpec(name="svc", sha256=hash_token("s3cret"), scopes=("admin",))
    auth = Authenticator((spec,))
    assert auth.authenticate("Bearer s3cret").name == "svc"
    assert auth.authenticate("bearer  s3cret").name == "svc"
    with pytest.raises(ApiError) as wrong:
        auth.authenticate("Bearer " + spec.sha256)  # the hash itself is not a token
    assert wrong.value.status == 401
    with pytest.raises(ApiError) as missing:
        auth.authenticate(None)
    assert missing.value.code == "unauthorized"


def test_disabled_auth_admits_everyone_as_admin() -> None:
    principal = Authenticator((), enabled=False).authenticate(None)
    assert "admin" in principal.scopes


def test_token_bucket_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate=10, burst=2)
    assert bucket.take() == 0
    assert bucket.take() == 0
    wait = bucket.take()
    assert 0 < wait <= 0.1
    bucket.updated -= 0.2  # as if 200 ms passed
    assert bucket.take() == 0
