"""`bandgate dlq list` at 80 columns: each id whole on one line (it wrapped over four)."""

from __future__ import annotations

from rich.console import Console

from bandgate.core.dead_letter_records import DeadLetter
from bandgate.ops.dlq_cli import dead_letter_table

MESSAGE_ID = "3f2b8c1e-7d4a-4b9e-9c2f-1a5e6d7c8b90"


def test_an_id_stays_on_one_line_and_the_reason_folds_under_it() -> None:
    record = DeadLetter(
        message_id=MESSAGE_ID,
        reason="ValueError: order total -3 is negative (line 42 of the CSV import)",
        cause="max-attempts",
        error_type="ValueError",
        attempts=5,
        original_band="hot",
        priority=8,
        failed_at=None,
        enqueued_at=None,
        age_seconds=3726.0,
    )
    console = Console(width=80, record=True, color_system=None)
    console.print(dead_letter_table([record], "orders.dlq"))
    lines = console.export_text().splitlines()
    [id_line] = [line for line in lines if MESSAGE_ID in line]
    assert id_line.split() == [MESSAGE_ID, "5", "hot", "8", "62.1", "min"]
    assert any(line.strip().startswith("max-attempts: ValueError") for line in lines)
    assert all(len(line) <= 80 for line in lines)
