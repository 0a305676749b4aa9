"""The version guard of the protocol code (`bandgate.core.protocol.compat`): the installed
libraries are in its ranges, a release outside them fails loudly at import, and pyproject.toml
pins the same ranges."""

from __future__ import annotations

import asyncio
import re
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import aiormq
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.core.broker import is_blocked
from bandgate.core.protocol import compat
from bandgate.core.protocol.compat import IncompatibleLibrary, Supported
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
    """`core.protocol.acks.closing` reads aiormq's private close event through
    `core.protocol.compat`: the installed release's Channel sets that very attribute when it is
    made, and the accessor returns it. Every ack a worker sends in the integration tests reads
    it as well."""
    assert "_Channel__close_event" in aiormq.Channel.__init__.__code__.co_names
    channel = aiormq.Channel.__new__(aiormq.Channel)
    event = asyncio.Event()
    vars(channel)["_Channel__close_event"] = event
    assert compat.close_event(channel) is event
    event.set()
    assert compat.close_event(channel).is_set()


async def test_a_channels_confirms_are_taken_where_the_real_aiormq_reads_them() -> None:
    """`core.protocol.confirms` answers a channel's Basic.Ack and Basic.Nack itself: the
    installed release's channel reader looks `_on_confirm_frame` up on the channel for each
    such frame, and `take_confirms` puts the handler there and hands back aiormq's own."""
    assert "_on_confirm_frame" in aiormq.Channel._reader.__code__.co_names
    channel = aiormq.Channel.__new__(aiormq.Channel)
    seen: list[object] = []

    async def handler(frame: object) -> None:
        seen.append(frame)

    own = compat.take_confirms(channel, handler)
    assert own.__func__ is aiormq.Channel._on_confirm_frame  # type: ignore[attr-defined]
    ack = aiormq.spec.Basic.Ack(delivery_tag=1)
    await channel._on_confirm_frame(ack)
    assert seen == [ack]


PRODUCT = ("topology", "core", "gateway", "consumers", "pull", "ops", "testing")
PROTOCOL_HOME = ROOT / "core" / "protocol"
# The one adapter outside the home: it needs uvicorn, which a worker's install lacks.
UVICORN_ADAPTER = ROOT / "gateway" / "http_server.py"
# Modules of a library's internals: frame codecs and uvicorn's protocol classes.
INTERNAL_IMPORT = re.compile(
    r"^\s*(?:from|import) (pamqp\.(?:frame|header|body|encode|decode)|uvicorn\.protocols)\b", re.M
)
MANGLED = re.compile(r"_[A-Z]\w*__[a-z]\w*")


def _product_modules() -> list[Path]:
    return [path for floor in PRODUCT for path in sorted((ROOT / floor).rglob("*.py"))]


def test_private_library_parts_are_touched_only_in_the_protocol_home() -> None:
    """A name-mangled attribute is read only by `compat`; pamqp's frame codecs and uvicorn's
    protocol classes are imported only by the protocol home (and uvicorn's by its adapter)."""
    outside = [
        f"{path.relative_to(ROOT)}: {match.group(1)}"
        for path in _product_modules()
        if PROTOCOL_HOME not in path.parents
        for match in INTERNAL_IMPORT.finditer(path.read_text())
        if not (path == UVICORN_ADAPTER and match.group(1) == "uvicorn.protocols")
    ]
    mangled = [
        f"{path.relative_to(ROOT)}: {match.group()}"
        for path in _product_modules()
        if path != PROTOCOL_HOME / "compat.py"
        for match in MANGLED.finditer(path.read_text())
    ]
    assert outside == []
    assert mangled == []


def test_every_protocol_module_checks_the_versions_when_imported() -> None:
    """Each module of the home that reaches into a library calls the guard at import."""
    reaching = [
        path.name
        for path in sorted(PROTOCOL_HOME.glob("*.py"))
        if path.name not in ("__init__.py", "compat.py", "content_header.py", "deliveries.py")
    ]
    assert reaching == ["acks.py", "confirms.py", "frames.py"]
    for name in reaching:
        text = (PROTOCOL_HOME / name).read_text()
        assert "\ncompat.check_amqp()" in text, name
    assert "compat.check_uvicorn()" in UVICORN_ADAPTER.read_text()
