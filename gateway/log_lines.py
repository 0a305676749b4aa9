"""One log record, one line: control characters in a log message are written as escapes.

Clients choose text that reaches the gateway process's log: message ids, a release's reason
(the worker library logs it), paths. A newline in it would write a line of the client's own
(`...\\n2026-11-26 06:30:00,000 CRITICAL bandgate.gateway.auth: token 'admin' leaked`). Escaping
each call's arguments would have to be right at every call, in every floor that logs in the
gateway's process; so the process's log records escape their own message instead
(`install`, from the app's lifespan): C0 and C1 control characters, DEL and the Unicode line
and paragraph separators become `\\n`, `\\x1b`, `\\u2028`, as Python writes them. A record's
traceback is not its message and keeps its lines. A message without such characters costs one
`str.isprintable`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

_SPECIAL = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPES: dict[int, str] = {
    code: _SPECIAL.get(chr(code), f"\\x{code:02x}") for code in (*range(0x20), *range(0x7F, 0xA0))
}
_ESCAPES |= {0x2028: "\\u2028", 0x2029: "\\u2029"}


def escape(text: str) -> str:
    """`text` on one line, its control characters escaped."""
    if text.isprintable():
        return text
    return text.translate(_ESCAPES)


class EscapedLogRecord(logging.LogRecord):
    """A log record whose message is on one line."""

    def getMessage(self) -> str:  # noqa: N802 (logging's name)
        return escape(super().getMessage())


_made: dict[type[logging.LogRecord], type[logging.LogRecord]] = {}


def install() -> None:
    """Make every log record of this process escape its message (idempotent). A record factory
    set before (by tracing, say) keeps making the records; they are given the escaping
    `getMessage`."""
    previous = logging.getLogRecordFactory()
    if previous is EscapedLogRecord or getattr(previous, "escapes_messages", False):
        return
    if previous is logging.LogRecord:
        logging.setLogRecordFactory(EscapedLogRecord)
        return

    def escaping(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if not isinstance(record, EscapedLogRecord):
            record.__class__ = _escaping(type(record))
        return record

    factory: Callable[..., logging.LogRecord] = escaping
    escaping.escapes_messages = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def _escaping(kind: type[logging.LogRecord]) -> type[logging.LogRecord]:
    made = _made.get(kind)
    if made is None:
        made = _made[kind] = type(f"Escaped{kind.__name__}", (EscapedLogRecord, kind), {})
    return made
