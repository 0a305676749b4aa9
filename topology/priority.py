"""Priorities: the AMQP range 0-9 (9 most urgent), with named aliases."""

from __future__ import annotations

MIN_PRIORITY = 0
MAX_PRIORITY = 9
DEFAULT_PRIORITY = 4

ALIASES: dict[str, int] = {
    "critical": 9,
    "high": 7,
    "normal": 4,
    "low": 2,
    "background": 0,
}


class PriorityError(ValueError):
    """A priority that is neither an integer 0-9 nor a known alias."""


def parse_priority(value: object) -> int:
    """Turn a request's priority (int, numeric string or alias) into 0-9.

    Booleans and floats are refused on purpose: JSON `true` or `7.5` is a client bug,
    not a priority.
    """
    if value is None:
        return DEFAULT_PRIORITY
    if isinstance(value, bool):
        raise PriorityError(f"priority must be an integer 0-9 or one of {_alias_list()}")
    if isinstance(value, int):
        if MIN_PRIORITY <= value <= MAX_PRIORITY:
            return value
        raise PriorityError(
            f"priority {value} is out of range: use {MIN_PRIORITY}-{MAX_PRIORITY} "
            f"({MAX_PRIORITY} most urgent) or one of {_alias_list()}"
        )
    if isinstance(value, str):
        name = value.strip().lower()
        if name in ALIASES:
            return ALIASES[name]
        # isdigit() alone accepts '²', which int() then refuses with a bare ValueError.
        if name.isascii() and name.isdigit():
            return parse_priority(int(name))
        raise PriorityError(f"unknown priority {value!r}: use 0-9 or one of {_alias_list()}")
    raise PriorityError(f"priority must be an integer 0-9 or one of {_alias_list()}")


def _alias_list() -> str:
    return ", ".join(f"{name}={level}" for name, level in ALIASES.items())
