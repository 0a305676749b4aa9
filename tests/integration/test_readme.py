"""The README's first screen and "First steps", run as a new user runs them: `make run` in one
shell, every other command as written in a second and third shell with nothing exported, then
`make run` stopped and started again, and the second shell's commands once more.

The commands come from the README's text, so it cannot drift from what works (the tutorial,
docs/tutorial.md, shows the same commands: tests/unit/test_docs_pages.py checks it, and what it
says of the management UI is checked here). What the test
adds: the gateway's port (a free one through BANDGATE_PORT for `make run`, so a developer's own
`make run` on :8000 does not collide; the commands' `localhost:8000` is rewritten to it), and
waits for what the README says takes time (the worker's start, the dead letter after ~15 s).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from bandgate.ops.local_broker import free_port
from tests.integration.dev_stack import DevStack, clean_environment

# `make run` starts the installed RabbitMQ, whatever version the session's nodes run.
pytestmark = [pytest.mark.integration, pytest.mark.broker_independent]

ROOT = Path(__file__).resolve().parents[2]
LONG_RUNNING = "# runs until Ctrl-C"
WAIT = 120.0


@dataclass(frozen=True)
class Command:
    text: str

    @property
    def long_running(self) -> bool:
        return LONG_RUNNING in self.text

    @property
    def prelude(self) -> bool:
        return self.text.startswith("source ")


def shell_commands(markdown: str) -> list[Command]:
    """The commands of every ```sh block, a command spanning lines by `\\` or open quotes."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", markdown, flags=re.DOTALL):
        pending = ""
        for line in block.splitlines():
            pending = f"{pending}\n{line}" if pending else line
            if pending.count("'") % 2 == 0 and not line.rstrip().endswith("\\"):
                if pending.strip() and not pending.lstrip().startswith("#"):
                    commands.append(Command(pending))
                pending = ""
    return commands


def section(title: str, page: str = "README.md") -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def first_screen() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split("\n## ", 1)[0]


class Shells:
    """A second and third shell in the checkout: each command a new `bash`, after the
    README's own `source` lines, with nothing of bandgate's exported."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        self.port = port
        self.preludes: list[str] = []
        self.worker: subprocess.Popen[bytes] | None = None
        self.worker_logs: list[Path] = []

    def script(self, command: Command) -> str:
        text = re.sub(r"(localhost|127\.0\.0\.1):8000\b", rf"\1:{self.port}", command.text)
        return "\n".join([*self.preludes, text])

    def run(self, command: Command) -> str:
        result = subprocess.run(
            ["bash", "-e", "-c", self.script(command)],
            cwd=self.directory,
            env=clean_environment(),
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
        )
        assert result.returncode == 0, f"{command.text}\n{result.stdout}\n{result.stderr}"
        if command.text.startswith("curl"):
            answer = json.loads(result.stdout)
            assert "error" not in answer, f"{command.text}\n{answer}"
            assert not answer.get("failed"), f"{command.text}\n{answer}"
        return result.stdout + result.stderr

    def start_worker(self, command: Command) -> Path:
        """Ctrl-C the worker the last long-running command started, then start this one."""
        self.stop_worker()
        log = self.directory / f"worker-{len(self.worker_logs)}.log"
        with log.open("wb") as out:
            self.worker = subprocess.Popen(
                ["bash", "-e", "-c", self.script(command)],
                cwd=self.directory,
                env=clean_environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.worker_logs.append(log)
        wait_for(log, "worker ready", self.worker)
        return log

    def stop_worker(self) -> None:
        worker, self.worker = self.worker, None
        if worker is None or worker.poll() is not None:
            return
        os.killpg(worker.pid, signal.SIGINT)
        try:
            assert worker.wait(WAIT) == 0
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(30)


def wait_for(log: Path, text: str, process: subprocess.Popen[bytes] | None = None) -> str:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        content = log.read_text(errors="replace")
        if text in content:
            return content
        if process is not None and process.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {log}:\n{log.read_text(errors='replace')[-3000:]}")


def reserved(log: Path) -> list[int]:
    return [int(n) for n in re.findall(r"order (\d+) reserved", log.read_text())]


def assert_management_ui_as_described(management_url: str | None) -> None:
    """The tutorial: "lists its queues by name: `emails.cold`, `emails.dlq`, `emails.hot`, then
    `orders.cold`, `orders.dlq`, `orders.hot`, `orders.warm`, then bandgate's own queues under
    `zz.bandgate.`: the 26 delay levels ... and the ledger of cancels (a stream)"; no receive
    has been served yet, so no replica queue."""
    assert management_url is not None
    queues = httpx.get(f"{management_url}/api/queues", timeout=30).json()
    names = sorted(queue["name"] for queue in queues)
    section_text = " ".join(section("The console and the broker", "docs/tutorial.md").split())
    listed = re.findall(r"`((?:emails|orders)\.\w+)`", section_text.split("zz.bandgate.")[0])
    assert len(listed) == 7, listed
    assert names[: len(listed)] == listed
    own = names[len(listed) :]
    assert all(name.startswith("zz.bandgate.") for name in own)
    delay = [name for name in own if name.startswith("zz.bandgate.delay.")]
    streams = [q["name"] for q in queues if q.get("type") == "stream"]
    assert len(delay) == 26
    assert streams == ["zz.bandgate.ledger"]
    assert len(own) == 26 + 1, own


def assert_pages_open(port: int) -> None:
    """ "Then open the console, http://127.0.0.1:8000/console ... and
    http://127.0.0.1:8000/docs": each page the section says to open answers, as HTML."""
    pages = re.findall(r"http://127\.0\.0\.1:8000(/[\w/]+)", section("First steps"))
    assert pages == ["/console", "/docs"], pages
    for page in pages:
        answer = httpx.get(f"http://127.0.0.1:{port}{page}", timeout=30)
        assert answer.status_code == 200, (page, answer.status_code)
        assert answer.headers["content-type"].startswith("text/html"), page


def check_counts(shells: Shells, command: Command) -> None:
    """A `bandgate stats` whose comment says `ready: hot 1, warm 1, cold 2` shows just that."""
    claim = re.search(r"# ready: (.*)$", command.text)
    if claim is None:
        return
    expected = {band: int(n) for band, n in re.findall(r"(\w+) (\d+)", claim[1])}
    shown = json.loads(shells.run(Command(command.text.split("#")[0].strip() + " --json")))
    assert {band["band"]: band["ready"] for band in shown["bands"]} == expected


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout that shares this one's virtualenv: `make run`'s setup step then has nothing
    to do (it would reinstall only if pyproject.toml were newer than the virtualenv)."""
    installed = ROOT / ".venv" / ".installed"
    assert installed.exists(), "run `make setup` first"
    assert installed.stat().st_mtime >= (ROOT / "pyproject.toml").stat().st_mtime, (
        "pyproject.toml is newer than .venv: run `make setup` first"
    )
    for name in (".venv", "Makefile", "pyproject.toml", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "bandgate.toml").write_text((ROOT / "bandgate.toml").read_text())
    return tmp_path


@pytest.fixture
def make_run(checkout: Path) -> Iterator[tuple[DevStack, int]]:
    [command] = [c for c in shell_commands(first_screen()) if c.text.startswith("make run")]
    port = free_port()
    stack = DevStack(
        checkout, ["bash", "-c", command.text], clean_environment(BANDGATE_PORT=str(port))
    )
    try:
        yield stack, port
    finally:
        stack.close()


def test_first_steps_run_as_written_in_a_second_shell_and_after_a_restart(
    make_run: tuple[DevStack, int],
) -> None:
    stack, port = make_run
    record = stack.start()
    assert_management_ui_as_described(record.management_url)
    shells = Shells(stack.directory, port)
    steps = shell_commands(section("First steps"))
    try:
        for command in steps:
            if command.prelude:
                shells.preludes.append(command.text)
            elif command.long_running:
                log = shells.start_worker(command)
                if len(shells.worker_logs) == 1:
                    # "It logs `order 42 reserved` first, then order 3, then the cold orders 1
                    # and 2".
                    wait_for(log, "order 2 reserved")
                    assert reserved(log)[:4] in ([42, 3, 1, 2], [42, 3, 2, 1])
            elif command.text.startswith("bandgate dlq list"):
                # "after ~15 s: order 7, reason OutOfStock, 5 attempts"
                deadline = time.monotonic() + WAIT
                while "OutOfStock" not in (shown := shells.run(command)):
                    assert time.monotonic() < deadline, shown
                    time.sleep(1)
                assert "only 100 in stock, order 7" in shells.worker_logs[0].read_text()
            else:
                shells.run(command)
                check_counts(shells, command)
        # "order 7 goes back to the hot band; the worker reserves it"
        wait_for(shells.worker_logs[-1], "order 7 reserved")
        assert_pages_open(port)
        # Only the order the README fails on purpose was ever refused or dead-lettered.
        first = shells.worker_logs[0].read_text()
        assert "Reject" not in first
        assert "NoneType: None" not in first  # a traceback logged outside its except block
        assert set(re.findall(r"order (\d+) wants", first)) == {"7"}
    finally:
        shells.stop_worker()

    stack.interrupt()  # make exits by SIGINT, as a terminal's Ctrl-C leaves it
    assert stack.record.dev_pid is None  # ...after `bandgate dev` stopped its node cleanly
    stack.start()
    second_shell = [c for c in steps if c.text.startswith(("source", "bandgate stats"))]
    shells = Shells(stack.directory, port)
    for command in second_shell:
        if command.prelude:
            shells.preludes.append(command.text)
        else:
            shells.run(command)
    stack.interrupt()
    assert stack.record.dev_pid is None


def test_the_readme_commands_are_found() -> None:
    """The parser sees the commands the README shows (else the test above would pass on none)."""
    steps = [c.text.split("\n")[0] for c in shell_commands(section("First steps"))]
    assert steps[0] == "source .venv/bin/activate      # puts `bandgate` on PATH"
    assert sum(c.startswith("curl") for c in steps) == 3
    assert sum(LONG_RUNNING in c for c in steps) == 2
    assert any(c.startswith("bandgate dlq replay") for c in steps)
