"""`bandgate dev` / `make run` as a process a test starts, stops and kills, as a user would."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from bandgate.topology.dev_record import DevRecord, read_record, record_path

READY_TIMEOUT = 180.0  # a node's first boot under a loaded CI machine, plus the topology
START_LOCK = Path(tempfile.gettempdir()) / "bandgate-dev-start.lock"


def clean_environment(**more: str) -> dict[str, str]:
    """The environment of a new shell: nothing of bandgate's exported (the session's own
    BANDGATE_TEST_* or BANDGATE_RABBITMQ_ROOT must not steer the product under test)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BANDGATE_", "RABBITMQ_"))}
    env.update(more)
    return env


class DevStack:
    """One `bandgate dev` (or `make run`) in `directory`, in a process group of its own."""

    def __init__(self, directory: Path, command: Sequence[str], env: Mapping[str, str]) -> None:
        self.directory = directory
        self.command = list(command)
        self.env = dict(env)
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log(self) -> Path:
        return self.directory / f"dev-{self.starts}.log"

    @property
    def record(self) -> DevRecord:
        record = read_record(record_path(self.directory))
        assert record is not None, f"no {record_path(self.directory)}"
        return record

    def start(self) -> DevRecord:
        """Start it and return once its gateway answers /readyz with 200.

        One start at a time on this machine: `bandgate dev` takes its preferred ports (5682,
        15682, 25682) when they are free, and two nodes starting at once in two test processes
        both found them free and collided. Once a node listens, the next start sees the ports
        taken and picks free ones."""
        with open(START_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return self._start()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _start(self) -> DevRecord:
        self.starts += 1
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=self.directory,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"start {self.starts} exited: {self.log.read_text()[-3000:]}")
            record = read_record(record_path(self.directory))
            if record is not None and record.dev_pid is not None and self._ready(record):
                return record
            time.sleep(0.2)
        raise AssertionError(f"start {self.starts} not ready: {self.log.read_text()[-3000:]}")

    @staticmethod
    def _ready(record: DevRecord) -> bool:
        try:
            return httpx.get(f"{record.gateway_url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def interrupt(self, timeout: float = 120.0) -> int:
        """Ctrl-C, as a terminal sends it to the whole foreground group; wait for the exit."""
        process = self.process
        assert process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        try:
            return process.wait(timeout)
        finally:
            self.process = None

    def kill(self) -> None:
        """SIGKILL `bandgate dev` itself: its node, in a session of its own, lives on."""
        process = self.process
        assert process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        self.process = None

    def kill_node(self) -> None:
        """SIGKILL the private node's whole process group: a crash of the broker."""
        pid = self.record.node_pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)

    def close(self) -> None:
        """Stop whatever is left: the dev process, then a node it may have left running."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                self.interrupt(60)
        if self.process is not None:
            self.kill()
        record = read_record(record_path(self.directory))
        if record is not None and record.node_pid is not None:
            from bandgate.ops.local_broker import stop_left_running

            stop_left_running(record.node_pid)


__all__ = ["READY_TIMEOUT", "DevStack", "clean_environment"]
