"""Where `bandgate dev` (`make run`) says its broker and gateway are.

`bandgate dev` writes `.bandgate/dev.json` in the directory it runs in; every other command
run in that directory (or below it) with no `BANDGATE_AMQP_URL` reads it, so a second shell
reaches the broker that `make run` started, on whatever ports it got, with nothing exported.
We chose a file over fixed default ports: the default ports (5672) may belong to another
broker on the same machine, and a command must never talk to that one without saying so.
The record stays after the stack stops, so the commands keep naming that broker (and say it
is down) instead of quietly falling back to another one.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

RECORD_DIR = ".bandgate"
RECORD_NAME = "dev.json"


@dataclass(frozen=True)
class DevRecord:
    amqp_url: str
    management_url: str | None
    gateway_url: str
    node: str | None  # the private node's name; None when `bandgate dev` used a given broker
    dev_pid: int | None  # the `bandgate dev` process while it runs
    node_pid: int | None  # the private node's process group while it runs

    @property
    def running(self) -> bool:
        return self.dev_pid is not None and process_runs(self.dev_pid, b"bandgate")


def process_runs(pid: int, program: bytes) -> bool:
    """Whether `pid` runs and is `program` (its command line names it): a zombie left by a
    killed process does not count, nor a pid the system has given to another program since."""
    proc = Path("/proc", str(pid))
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        command = (proc / "cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return state != "Z" and program in command


def record_path(base: Path) -> Path:
    return base / RECORD_DIR / RECORD_NAME


def find_record(start: Path | None = None) -> tuple[Path, DevRecord] | None:
    """The nearest record from `start` (default: the working directory) up to the root."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        path = record_path(directory)
        record = read_record(path)
        if record is not None:
            return path, record
    return None


def read_record(path: Path) -> DevRecord | None:
    """The record at `path`; None when absent or unreadable (a torn write is no record)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return DevRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def write_record(base: Path, record: DevRecord) -> Path:
    """Write atomically (rename), readable by the owner only: the URLs carry a password."""
    path = record_path(base)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        json.dump(asdict(record), file, indent=2)
    temporary.replace(path)
    return path


__all__ = ["DevRecord", "find_record", "process_runs", "read_record", "record_path", "write_record"]
