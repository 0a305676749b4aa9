"""A benchmark's helper process: `python -m MODULE CONFIG`, talking back over stdout and a file.

The paced publisher and the worker processes both take their config as JSON on the command
line, say where they are with lines on an unbuffered stdout, and leave their record as JSON in
the file named by the second argument, which the parent reads and deletes. `ChildProcess` is
that handle, once.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import orjson

from bench.environment import wait_for_line

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class ChildProcess:
    """Start `python -m module` with `config`; the record is read once it exits with 0."""

    def __init__(self, module: str, config: DataclassInstance) -> None:
        descriptor, self.out = tempfile.mkstemp(prefix=f"{module}-", suffix=".json")
        os.close(descriptor)
        self.module = module
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, json.dumps(asdict(config)), self.out],
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        self.pid = self.process.pid

    def expect_line(self, line: str, timeout: float) -> None:
        wait_for_line(self.process, line, timeout)

    def wait(self, timeout: float) -> Any:
        """The record, once the child exited by itself; killed and RuntimeError if it does not."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"{self.module} did not finish within {timeout:g} s") from None
        if self.process.returncode != 0:
            raise RuntimeError(f"{self.module} exited with {self.process.returncode}")
        return orjson.loads(Path(self.out).read_bytes())

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.kill()
        if self.process.stdout is not None:
            self.process.stdout.close()
        with contextlib.suppress(OSError):
            os.unlink(self.out)
