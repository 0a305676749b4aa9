"""What each way of installing bandgate brings: the base install runs a Python producer and a
worker without the HTTP stack, `bandgate[gateway]` adds the gateway, its console and the
`bandgate` command line, `bandgate[all]` the OTLP exporter as well.

The wheel is built from the sources, and every install goes into a fresh virtualenv outside the
repository, its dependencies resolved from PyPI by pip (so a pin that cannot hold fails here).
They are fetched once into `.bandgate/wheelhouse` and installed from there; a later run asks
the index again (the pins must still resolve) but downloads only what changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.test_floors import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.broker_independent]

WHEELHOUSE = ROOT / ".bandgate" / "wheelhouse"
PIP_SECONDS = 600.0
HTTP_STACK = ("starlette", "uvicorn", "typer", "rich", "httptools")

# Run by each install's interpreter, from a directory outside the repository: imports what the
# install promises and prints which of the HTTP stack's packages that loaded.
WORKER_AND_PRODUCER = """
import sys
import bandgate
from bandgate import ConsumerApp, Message, Producer, Reject, Retry, SyncProducer
import bandgate.consumers.worker, bandgate.core.broker, bandgate.core.protocol.confirms
import bandgate.core.protocol.frames

app = ConsumerApp()

@app.consumer("orders")
async def handle(message: Message) -> None:
    pass

assert bandgate.__file__.startswith(sys.prefix), bandgate.__file__
print(*sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[1:])))
"""
GATEWAY = """
import bandgate.gateway.app, bandgate.gateway.http_server, bandgate.pull.app, bandgate.ops.cli
"""
OTLP = "import opentelemetry.exporter.otlp.proto.http.trace_exporter"


def _environment(**more: str) -> dict[str, str]:
    """pip's own settings (index, certificates, find-links) and nothing else of this process's
    environment: no PYTHONPATH, no BANDGATE_*."""
    kept = {name: value for name, value in os.environ.items() if name.startswith("PIP_")}
    kept |= {name: os.environ[name] for name in ("HOME",) if name in os.environ}
    return {"PATH": "/usr/bin:/bin", "PIP_NO_INPUT": "1", **kept, **more}


def _pip(*args: str | Path, cwd: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--quiet", *map(str, args)],
        check=True,
        cwd=cwd,
        env=_environment(TMPDIR=str(cwd)),
        timeout=PIP_SECONDS,
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's wheel, its dependencies (every extra's) in the wheelhouse."""
    build, out = tmp_path_factory.mktemp("build"), tmp_path_factory.mktemp("wheel")
    _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", out, ROOT, cwd=build)
    (built,) = out.glob("bandgate-*.whl")
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    # Resolved from the index: this is where pins that cannot all hold fail.
    _pip("wheel", "--wheel-dir", WHEELHOUSE, f"{built}[all]", cwd=build)
    for stale in WHEELHOUSE.glob("bandgate-*.whl"):
        stale.unlink()  # the package itself always comes from this run's build
    return built


Installer = Callable[[str], Path]


@pytest.fixture(scope="module")
def install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installer:
    """A fresh virtualenv with the wheel installed with `extras` ("" for the base install);
    its interpreter."""

    def installed(extras: str) -> Path:
        where = tmp_path_factory.mktemp(f"venv-{extras or 'base'}")
        assert not where.is_relative_to(ROOT)
        venv.create(where, with_pip=False)
        python = where / "bin" / "python"
        wanted = f"{wheel}[{extras}]" if extras else str(wheel)
        offline = ("--no-index", "--find-links", WHEELHOUSE)
        _pip("--python", python, "install", *offline, wanted, cwd=where)
        _pip("--python", python, "check", cwd=where)
        return python

    return installed


def _env(python: Path) -> dict[str, str]:
    """The install's programs first on PATH, and the shipped topology (a consumer's options
    are checked against it when the decorator runs)."""
    return {
        "PATH": f"{python.parent}:/usr/bin:/bin",
        "BANDGATE_TOPOLOGY": str(ROOT / "bandgate.toml"),
    }


def _execute(python: Path, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `argv` as the install's user would: its programs first on PATH."""
    return subprocess.run(
        argv, check=False, capture_output=True, text=True, cwd=cwd, env=_env(python), timeout=120
    )


def _run(python: Path, script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return _execute(python, [str(python), "-c", script, *args], cwd)


def _succeeds(python: Path, script: str, cwd: Path, *args: str) -> str:
    done = _run(python, script, *args, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _fails_for_want_of(python: Path, script: str, module: str, cwd: Path) -> None:
    done = _run(python, script, cwd=cwd)
    assert f"No module named '{module}" in done.stderr, done.stderr


def test_the_base_install_runs_a_producer_and_a_worker_without_the_http_stack(
    install: Installer, tmp_path: Path
) -> None:
    python = install("")
    assert _succeeds(python, WORKER_AND_PRODUCER, tmp_path, *HTTP_STACK).split() == []
    # The worker's command line is there; the gateway is not installed at all.
    worker = _execute(python, [str(python), "-m", "bandgate.consumers", "--help"], tmp_path)
    assert worker.returncode == 0, worker.stderr
    assert "TARGET" in worker.stdout.upper()
    _fails_for_want_of(python, GATEWAY, "starlette", tmp_path)
    _fails_for_want_of(python, OTLP, "opentelemetry.exporter", tmp_path)
    # The `bandgate` command is installed with the package: it names the extra it needs.
    command = _execute(python, [str(python.parent / "bandgate"), "--help"], tmp_path)
    assert command.returncode != 0
    assert "pip install 'bandgate[gateway]'" in command.stderr, command.stderr


def test_the_gateway_extra_serves_http_and_leaves_the_worker_as_it_was(
    install: Installer, tmp_path: Path
) -> None:
    python = install("gateway")
    _succeeds(python, GATEWAY, tmp_path)
    loaded = _succeeds(python, WORKER_AND_PRODUCER, tmp_path, *HTTP_STACK).split()
    assert not {"starlette", "uvicorn"} & set(loaded)
    assert (python.parent / "bandgate").exists()
    _fails_for_want_of(python, OTLP, "opentelemetry.exporter", tmp_path)


def test_the_all_extra_adds_the_otlp_exporter(install: Installer, tmp_path: Path) -> None:
    python = install("all")
    _succeeds(python, f"{GATEWAY}\n{OTLP}", tmp_path)
