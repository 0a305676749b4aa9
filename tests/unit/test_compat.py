"""The version guard of the protocol code (`bandgate.core.compat`): the installed libraries are
in its ranges, a release outside them fails loudly at import, and pyproject.toml pins the same
ranges."""

from __future__ import annotations

import asyncio
import re
import tomllib
from types import SimpleNamespace
from typing import cast

import aiormq
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.core import compat
from bandgate.core.broker import is_blocked
from bandgate.core.compat import IncompatibleLibrary, Supported
from tests.unit.test_floors import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pinned(name: str) -> str:
    """The specifier pyproject.toml gives `name`, in the base install or an extra."""
    requirements = [*PROJECT["dependencies"]]
    for extra in PROJECT["optional-dependencies"].values():
        requirements += extra
    found = [
        re.sub(r"^[\w.-]+(\[[\w,]+\])?", "", requirement.split(";")[0].split("#")[0]).strip()
        for requirement in requirements
        if re.match(rf"{re.escape(name)}(\[|>|<|=|$)", requirement)
    ]
    assert len(found) == 1, (name, found)
    return found[0]


@pytest.mark.parametrize("library", compat.SUPPORTED, ids=lambda library: library.name)
def test_pyproject_pins_the_ranges_the_guard_checks(library: Supported) -> None:
    assert _pinned(library.name) == library.specifier


def test_the_installed_libraries_are_in_range() -> None:
    compat.check(*compat.SUPPORTED)


@pytest.mark.parametrize(
    ("installed", "holds"),
    [("7.2.4", True), ("7.2.9", True), ("7.2.3", False), ("7.3.0", False), ("7.3.0rc1", False),
     ("8", False)],
)  # fmt: skip
def test_a_version_outside_the_range_is_refused(
    installed: str, holds: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert compat.AIORMQ.holds_for(installed) is holds
    monkeypatch.setattr(compat, "version", lambda name: installed)
    if holds:
        compat.check(compat.AIORMQ)
    else:
        with pytest.raises(IncompatibleLibrary, match=rf"aiormq {installed} is installed"):
            compat.check(compat.AIORMQ)


def test_a_missing_library_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = Supported("no-such-distribution-of-bandgate", "1", "2", "nothing")
    with pytest.raises(IncompatibleLibrary, match="no-such-distribution-of-bandgate is not"):
        compat.check(missing)


def test_the_guard_is_an_import_error() -> None:
    """Code that imports an optional part inside `try: ... except ImportError` treats a library
    out of range as a library missing, never as a crash of its own."""
    assert issubclass(IncompatibleLibrary, ImportError)


async def test_a_blocked_connection_is_read_from_the_real_aiormq() -> None:
    """`core.broker.is_blocked` reads aiormq's private unblocked event: it exists in the
    installed release, and clearing it (as Connection.Blocked does) reads as blocked."""
    connection = aiormq.Connection("amqp://guest:guest@127.0.0.1:1/")
    unblocked = vars(connection)["_Connection__connection_unblocked"]
    assert isinstance(unblocked, asyncio.Event)
    robust = cast(
        AbstractRobustConnection, SimpleNamespace(transport=SimpleNamespace(connection=connection))
    )
    unblocked.set()
    assert not is_blocked(robust)
    unblocked.clear()
    assert is_blocked(robust)


def test_a_closing_channel_is_read_from_the_real_aiormq() -> None:
    """`consumers.acks.closing` reads aiormq's private close event through `core.compat`: the
    installed release's Channel sets that very attribute when it is made, and the accessor
    returns it. Every ack a worker sends in the integration tests reads it as well."""
    assert "_Channel__close_event" in aiormq.Channel.__init__.__code__.co_names
    channel = aiormq.Channel.__new__(aiormq.Channel)
    event = asyncio.Event()
    vars(channel)["_Channel__close_event"] = event
    assert compat.close_event(channel) is event
    event.set()
    assert compat.close_event(channel).is_set()
