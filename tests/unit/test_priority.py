from __future__ import annotations

import pytest

from bandgate.topology.priority import ALIASES, DEFAULT_PRIORITY, PriorityError, parse_priority


@pytest.mark.parametrize("level", range(10))
def test_every_amqp_level_is_itself(level: int) -> None:
    assert parse_priority(level) == level


def test_omitted_priority_is_the_default() -> None:
    assert parse_priority(None) == DEFAULT_PRIORITY == 4


@pytest.mark.parametrize(
    ("alias", "level"),
    [("critical", 9), ("high", 7), ("normal", 4), ("low", 2), ("background", 0)],
)
def test_aliases(alias: str, level: int) -> None:
    assert ALIASES[alias] == level
    assert parse_priority(alias) == level


@pytest.mark.parametrize(("text", "level"), [("HIGH", 7), (" Critical ", 9), ("bAcKgRoUnD", 0)])
def test_aliases_ignore_case_and_surrounding_space(text: str, level: int) -> None:
    assert parse_priority(text) == level


@pytest.mark.parametrize(("text", "level"), [("0", 0), ("7", 7), (" 9 ", 9), ("07", 7)])
def test_numeric_strings(text: str, level: int) -> None:
    assert parse_priority(text) == level


@pytest.mark.parametrize("value", [10, -1, 255, "10", "99999999999999999999"])
def test_out_of_range_is_refused_with_the_range(value: object) -> None:
    with pytest.raises(PriorityError, match=r"out of range: use 0-9 \(9 most urgent\)"):
        parse_priority(value)


@pytest.mark.parametrize("value", ["urgent", "", "-1", "7.5", "seven", "²", "７", "٣"])
def test_unknown_strings_are_refused_with_the_choices(value: str) -> None:
    with pytest.raises(PriorityError, match="unknown priority") as caught:
        parse_priority(value)
    assert "critical=9, high=7, normal=4, low=2, background=0" in str(caught.value)


@pytest.mark.parametrize("value", [True, False, 7.0, 7.5, [7], {"p": 7}, b"7"])
def test_booleans_floats_and_other_types_are_refused(value: object) -> None:
    """JSON `true` or `7.0` is a client bug, not a priority."""
    with pytest.raises(PriorityError, match="must be an integer 0-9"):
        parse_priority(value)


def test_priority_error_is_a_value_error() -> None:
    assert issubclass(PriorityError, ValueError)
