"""What the image installs runs: the gateway, the example worker and a Python producer.

There is no Docker engine here, so this does what `docker build` would: the files the
Dockerfile's COPY lines take are laid out as they land in the image (read by
tests/unit/test_compose.py), a wheel is built from the sources its RUN installs, and the wheel is
installed into a fresh virtualenv outside the repository. The programs then run from
directories outside the repository too, so a module or a data file the wheel lacks fails here,
instead of being found in the working tree as it would be by every other test.

The virtualenv takes the wheel's dependencies from the development one through a .pth line
naming its site-packages: no download, and the repository stays off the path (a .pth line only
adds its directory; the editable install's own .pth files there are not run).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import aio_pika
import httpx
import pytest
import yaml

from bandgate.ops.local_broker import free_port
from bandgate.topology import naming
from bandgate.topology.loader import load_topology
from tests.unit.test_compose import Image, dockerfile, in_image, lay_out
from tests.unit.test_floors import FLOORS

pytestmark = [pytest.mark.integration, pytest.mark.broker_independent]

ROOT = Path(__file__).resolve().parents[2]
STARTUP_SECONDS = 60.0

# Run by the installed interpreter, from a directory outside the repository and the image: a
# producer in someone else's project, with only BANDGATE_AMQP_URL and BANDGATE_TOPOLOGY set.
PRODUCER = """
import asyncio, sys
import bandgate
from bandgate import Producer

async def main() -> None:
    async with Producer.connect() as producer:
        published = await producer.publish("orders", {"order_id": sys.argv[1]}, priority=8)
    print(bandgate.__file__, published.band)

asyncio.run(main())
"""


@dataclass(frozen=True)
class Installed:
    """The laid-out image and the virtualenv its wheel is installed in."""

    image: Image
    root: Path
    venv: Path

    @property
    def workdir(self) -> Path:
        return in_image(self.root, self.image.workdir)

    def env(self, amqp_url: str) -> dict[str, str]:
        """The image's ENV, its topology path mapped into the laid-out image, and nothing of
        this process's environment (no PYTHONPATH, no BANDGATE_* of the developer's shell)."""
        env = dict(self.image.env)
        topology = PurePosixPath(env["BANDGATE_TOPOLOGY"])
        env["BANDGATE_TOPOLOGY"] = str(in_image(self.root, topology))
        env["BANDGATE_AMQP_URL"] = amqp_url
        env["PATH"] = f"{self.venv / 'bin'}:/usr/bin:/bin"
        env["HOME"] = "/nonexistent"  # the image's user has no home
        return env

    def program(self, name: str, env: dict[str, str]) -> str:
        """`name` as PATH finds it: the virtualenv's, never the development one's."""
        found = shutil.which(name, path=env["PATH"])
        assert found is not None, name
        assert Path(found).is_relative_to(self.venv), found
        return found


def _run(args: list[str], cwd: Path) -> None:
    subprocess.run(
        args,
        check=True,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(cwd), "PIP_NO_INPUT": "1"},
        timeout=STARTUP_SECONDS,
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    image = dockerfile()
    root = tmp_path_factory.mktemp("image")
    lay_out(image, ROOT, root)
    build, wheels, venv = (tmp_path_factory.mktemp(name) for name in ("build", "wheels", "venv"))
    assert not venv.is_relative_to(ROOT)
    sources = in_image(root, image.installed_from())
    python = [sys.executable, "-m", "pip", "--quiet"]
    # The dependencies are not fetched (no network, no download each run): --no-deps here, and
    # the development virtualenv's site-packages below. setuptools comes from there as well.
    build_wheel = ["wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels)]
    _run([*python, *build_wheel, str(sources)], build)
    (wheel,) = wheels.glob("bandgate-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], build)
    target = ["--python", str(venv / "bin" / "python")]
    # Installed before the .pth is written: pip then sees no other `bandgate` in that
    # environment, so it never considers the development install (an editable one) its own.
    _run([*python, *target, "install", "--no-deps", "--no-index", str(wheel)], build)
    site = subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
        cwd=build,
    ).stdout.strip()
    dependencies = dict.fromkeys(sysconfig.get_path(key) for key in ("purelib", "platlib"))
    assert str(ROOT) not in dependencies
    (Path(site) / "dependencies.pth").write_text("".join(f"{path}\n" for path in dependencies))
    return Installed(image, root, venv)


def test_the_package_imported_is_the_wheels(installed: Installed, tmp_path: Path) -> None:
    """Every floor resolves to the virtualenv: had the wheel missed one, the import would fail,
    as the repository is not on the path."""
    check = ["import sys, bandgate", "print(bandgate.__file__)"]
    check += [f"import bandgate.{floor}; print(bandgate.{floor}.__file__)" for floor in FLOORS]
    check.append("print(*sys.path, sep='\\n')")
    env = installed.env("amqp://unused/")
    found = subprocess.run(
        [installed.program("python", env), "-c", "\n".join(check)],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=STARTUP_SECONDS,
    ).stdout.splitlines()
    files, path = found[: len(FLOORS) + 1], found[len(FLOORS) + 1 :]
    for file in files:
        assert Path(file).is_relative_to(installed.venv), file
    assert ROOT not in {Path(entry) for entry in path if entry}


@dataclass
class Process:
    """A program the test started, its output going to `log`."""

    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, what: str, condition: Callable[[], bool]) -> None:
        """Poll `condition` until it holds; fail with the program's output once it has exited
        or the deadline passed (the program reports through its log and its HTTP port, nothing
        this process can await)."""
        deadline = time.monotonic() + STARTUP_SECONDS
        while not condition():
            code = self.popen.poll()
            if code is not None:
                pytest.fail(f"exited {code} before {what}:\n{self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {STARTUP_SECONDS:.0f} s:\n{self.output()}")
            time.sleep(0.1)

    def stop(self, grace: float = 30) -> int:
        """SIGTERM, as `docker stop` sends; SIGKILL if it has not exited within `grace`."""
        if self.popen.poll() is None:
            self.popen.terminate()
        try:
            return self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(timeout=10)


@contextmanager
def started(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> Iterator[Process]:
    with log.open("wb") as out:
        popen = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    process = Process(popen, log)
    try:
        yield process
    finally:
        process.stop()


def on_port(command: list[str], port: int) -> list[str]:
    """The image's command bound to 127.0.0.1 and a free port: 0.0.0.0:8000 is the container's
    own address; here it would be every interface of a shared machine."""
    host = command.index("--host")
    return [*command[:host], "--host", "127.0.0.1", *command[host + 2 :], "--port", str(port)]


def status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.TransportError:
        return None


def test_the_images_command_serves_a_ready_gateway(
    installed: Installed, amqp_url: str, tmp_path: Path
) -> None:
    env = installed.env(amqp_url)
    port = free_port()
    command = on_port(installed.image.cmd, port)
    command[0] = installed.program(command[0], env)
    base = f"http://127.0.0.1:{port}"
    with started(command, tmp_path, env, tmp_path / "gateway.log") as gateway:
        gateway.wait_for("/readyz answering 200", lambda: status(f"{base}/readyz") == 200)
        console = httpx.get(f"{base}/console", timeout=5)  # package data, read from the wheel
        assert console.status_code == 200
        assert console.headers["content-type"].startswith("text/html")
        # uvicorn shuts down on SIGTERM, then raises the signal again to exit by it, as
        # `docker stop` expects; a gateway that hung would be killed (-9) instead.
        assert gateway.stop() == -signal.SIGTERM, gateway.output()
        assert "Application shutdown complete" in gateway.output()


async def band_depths(amqp_url: str, names: list[str]) -> dict[str, int]:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        depths = {}
        for name in names:
            queue = await channel.declare_queue(name, passive=True)
            depths[name] = queue.declaration_result.message_count or 0
    return depths


def test_the_example_worker_consumes_what_a_producer_publishes(
    installed: Installed, amqp_url: str, tmp_path: Path
) -> None:
    """The worker runs as compose runs it, in the image's working directory, which holds the
    example module; the producer runs elsewhere, from the installed package alone."""
    env = installed.env(amqp_url)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = list(compose["services"]["worker"]["command"])
    command[0] = installed.program(command[0], env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    order = f"order-{uuid.uuid4().hex[:12]}"
    with started(command, installed.workdir, env, tmp_path / "worker.log") as worker:
        worker.wait_for("worker ready", lambda: "worker ready: " in worker.output())
        published = subprocess.run(
            [installed.program("python", env), "-c", PRODUCER, order],
            check=False,
            capture_output=True,
            text=True,
            cwd=elsewhere,
            env=env,
            timeout=STARTUP_SECONDS,
        )
        assert published.returncode == 0, published.stderr
        module, band = published.stdout.split()
        assert Path(module).is_relative_to(installed.venv)
        assert band == "hot"
        worker.wait_for("the order handled", lambda: f"order {order} reserved" in worker.output())
        assert worker.stop() == 0, worker.output()

    # Stopped: a message it held unacknowledged would be back in its band now.
    spec = load_topology(env["BANDGATE_TOPOLOGY"]).queues["orders"]
    names = [name for band in spec.bands for name in spec.band_queues(band)]
    names.append(naming.dead_letter_queue("orders"))
    assert asyncio.run(band_depths(amqp_url, names)) == dict.fromkeys(names, 0)
