"""Loading the topology from TOML, with errors that name the file, queue and band."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bandgate.topology.model import Topology

TOPOLOGY_ENV = "BANDGATE_TOPOLOGY"
DEFAULT_TOPOLOGY_PATH = "bandgate.toml"


class TopologyError(ValueError):
    """The topology file is missing, unreadable or invalid."""


def topology_path(path: str | os.PathLike[str] | None = None) -> Path:
    return Path(path or os.environ.get(TOPOLOGY_ENV) or DEFAULT_TOPOLOGY_PATH)


def load_topology(path: str | os.PathLike[str] | None = None) -> Topology:
    """Read and validate a topology file (`BANDGATE_TOPOLOGY`, default ./bandgate.toml)."""
    source = topology_path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TopologyError(
            f"{source}: topology file not found (set {TOPOLOGY_ENV} or create it)"
        ) from None
    except OSError as exc:
        raise TopologyError(f"{source}: cannot read topology file: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(f"{source}: invalid TOML: {exc}") from None
    return parse_topology(data, source=str(source))


def parse_topology(data: Mapping[str, Any], source: str = "<topology>") -> Topology:
    try:
        return Topology.model_validate(dict(data))
    except ValidationError as exc:
        problems = [f"{source}: {_where(data, err['loc'])}{_message(err)}" for err in exc.errors()]
        raise TopologyError("\n".join(problems)) from None


def _message(err: Mapping[str, Any]) -> str:
    message = str(err["msg"])
    return message.removeprefix("Value error, ")


def _where(data: Mapping[str, Any], loc: tuple[int | str, ...]) -> str:
    """Say 'queue 'orders', band 'warm', field 'type': ' for a pydantic error location."""
    parts: list[str] = []
    if len(loc) >= 2 and loc[0] == "queues":
        queue = str(loc[1])
        parts.append(f"queue {queue!r}")
        rest = loc[2:]
        if len(rest) >= 2 and rest[0] == "bands" and isinstance(rest[1], int):
            parts.append(f"band {_band_name(data, queue, rest[1])}")
            rest = rest[2:]
        if rest:
            parts.append(f"field {'.'.join(str(p) for p in rest)!r}")
    elif loc:
        parts.append(f"field {'.'.join(str(p) for p in loc)!r}")
    return ", ".join(parts) + ": " if parts else ""


def _band_name(data: Mapping[str, Any], queue: str, index: int) -> str:
    try:
        name = data["queues"][queue]["bands"][index]["name"]
    except (KeyError, IndexError, TypeError):
        return f"#{index + 1}"
    return repr(name)
