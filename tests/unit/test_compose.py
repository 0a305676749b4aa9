"""docker-compose.yml and the Dockerfile, checked by reading them (no Docker engine here).

The Dockerfile is read the way `docker build` reads it, and the files its COPY lines take are
laid out in a directory as they land in the image; the checks ask what the image needs to run
(every floor the package links to, the package data, the topology file, the worker's module),
not only that the copied paths exist. tests/integration/test_wheel_install.py builds and runs
what this layout holds.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from bandgate.ops.local_broker import NO_BUSY_WAIT, QUORUM_WAL_MAX_SIZE_BYTES, quorum_wal_key
from bandgate.topology import export
from bandgate.topology.loader import load_topology
from tests.unit.test_floors import FLOORS
from tools import broker_roots

ROOT = Path(__file__).resolve().parents[2]
CORE = {"rabbitmq", "gateway", "worker"}
TRACING = {"otel-collector", "jaeger"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of the service's bind mounts; named volumes are left out."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


def command(service: dict[str, Any]) -> str:
    value = service["command"]
    return shlex.join(value) if isinstance(value, list) else str(value)


def test_services_and_profiles(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == CORE | TRACING
    for name in CORE:
        assert "profiles" not in services[name], name
    for name in TRACING:
        assert services[name]["profiles"] == ["tracing"], name


def test_every_port_is_bound_to_localhost(services: dict[str, dict[str, Any]]) -> None:
    published = {
        name: [str(port) for port in service.get("ports", [])] for name, service in services.items()
    }
    assert published["rabbitmq"] == [
        "127.0.0.1:5672:5672",
        "127.0.0.1:15672:15672",
        "127.0.0.1:15692:15692",
    ]
    assert published["gateway"] == ["127.0.0.1:8000:8000"]
    assert published["jaeger"] == ["127.0.0.1:16686:16686"]
    for ports in published.values():
        for port in ports:
            assert port.startswith("127.0.0.1:"), port


def rabbitmq_version(services: dict[str, dict[str, Any]]) -> str:
    """The compose broker's RabbitMQ minor version ("4.3"), from its image tag."""
    image = re.fullmatch(r"rabbitmq:(\d+\.\d+)-management", services["rabbitmq"]["image"])
    assert image is not None, services["rabbitmq"]["image"]
    return image[1]


def test_rabbitmq_runs_a_version_the_suite_tests_with_the_committed_config_mounted(
    services: dict[str, dict[str, Any]],
) -> None:
    """A version the suite does not run on (`make test-matrix`) is one whose behaviour nobody
    has checked: the compose broker is the one a newcomer meets first."""
    assert rabbitmq_version(services) in broker_roots.SUITES
    rabbitmq = services["rabbitmq"]
    mounts = dict(bind_mounts(rabbitmq))
    assert mounts == {
        "./rabbitmq/rabbitmq.conf": "/etc/rabbitmq/rabbitmq.conf",
        "./rabbitmq/enabled_plugins": "/etc/rabbitmq/enabled_plugins",
        "./rabbitmq/definitions.json": "/etc/rabbitmq/definitions.json",
    }
    for volume in rabbitmq["volumes"]:
        if volume.startswith("./"):
            assert volume.endswith(":ro"), volume
    conf = (ROOT / "rabbitmq" / "rabbitmq.conf").read_text()
    assert re.search(r"^load_definitions = /etc/rabbitmq/definitions.json$", conf, re.M)
    for port in ("5672", "15672", "15692"):
        assert re.search(rf"^\S+ = {port}$", conf, re.M), port


def wal_settings() -> list[str]:
    """The settings (not the comments) of rabbitmq.conf that size a write-ahead log."""
    lines = (ROOT / "rabbitmq" / "rabbitmq.conf").read_text().splitlines()
    return [line for line in lines if re.match(r"^[\w.]+\.wal_max_size_bytes\s*=", line)]


def test_the_compose_broker_sizes_its_wal_as_private_nodes_do() -> None:
    [setting] = wal_settings()
    assert setting.endswith(f" = {QUORUM_WAL_MAX_SIZE_BYTES}")


def test_the_compose_broker_does_not_busy_wait_as_private_nodes_do(
    services: dict[str, dict[str, Any]],
) -> None:
    erl_args = services["rabbitmq"]["environment"]["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
    assert erl_args == NO_BUSY_WAIT


def test_the_compose_broker_names_its_wal_by_the_key_its_version_takes(
    services: dict[str, dict[str, Any]],
) -> None:
    """A key the version does not know stops the node at boot; a key it ignores (`raft.` on
    4.3) leaves the WAL at 512 MiB and its stalls. The rule is the private nodes' own."""
    version = rabbitmq_version(services)
    assert wal_settings() == [f"{quorum_wal_key(version)} = {QUORUM_WAL_MAX_SIZE_BYTES}"]


def test_every_mounted_file_exists(services: dict[str, dict[str, Any]]) -> None:
    for service in services.values():
        for source, _ in bind_mounts(service):
            assert (ROOT / source).is_file(), source


def test_rabbitmq_has_a_healthcheck_the_apps_wait_for(
    services: dict[str, dict[str, Any]],
) -> None:
    check = services["rabbitmq"]["healthcheck"]
    assert "rabbitmq-diagnostics" in " ".join(check["test"])
    assert check["retries"] >= 3
    for name in ("gateway", "worker"):
        assert services[name]["depends_on"] == {"rabbitmq": {"condition": "service_healthy"}}
    assert "/readyz" in " ".join(services["gateway"]["healthcheck"]["test"])


def test_the_apps_run_bandgate_against_the_compose_broker(
    services: dict[str, dict[str, Any]],
) -> None:
    gateway, worker = services["gateway"], services["worker"]
    assert command(gateway).startswith("bandgate gateway --host 0.0.0.0")
    assert command(worker) == "bandgate worker examples.worker:app"
    for service in (gateway, worker):
        assert service["build"] == "."
        assert service["image"] == "bandgate:dev"
        env = service["environment"]
        amqp = urlsplit(env["BANDGATE_AMQP_URL"])
        assert (amqp.scheme, amqp.hostname, amqp.port) == ("amqp", "rabbitmq", 5672)
        assert (amqp.username, amqp.password) == (export.DEV_USER, export.DEV_PASSWORD)
        management = urlsplit(env["BANDGATE_MANAGEMENT_URL"])
        assert (management.hostname, management.port) == ("rabbitmq", 15672)
        assert (management.username, management.password) == (export.DEV_USER, export.DEV_PASSWORD)
        assert env["BANDGATE_TOPOLOGY"] == "/app/bandgate.toml"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "${OTEL_EXPORTER_OTLP_ENDPOINT:-}"
    assert gateway["environment"]["OTEL_SERVICE_NAME"] == "bandgate-gateway"
    assert worker["environment"]["OTEL_SERVICE_NAME"] == "bandgate-worker"


def test_the_collector_sends_traces_to_jaeger(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    [config] = services["otel-collector"]["configs"]
    assert f"--config={config['target']}" in services["otel-collector"]["command"]
    collector = yaml.safe_load(compose["configs"][config["source"]]["content"])
    assert collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"
    assert collector["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"
    assert collector["service"]["pipelines"]["traces"]["exporters"] == ["otlp/jaeger"]
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


# The Dockerfile, read as `docker build` reads it.


@dataclass(frozen=True)
class Copy:
    """One COPY: paths in the build context, and where they land in the image."""

    sources: tuple[str, ...]
    destination: PurePosixPath  # absolute: the WORKDIR of the moment applied
    into: bool  # "dir/" or several sources: each lands inside the destination, by its name


@dataclass(frozen=True)
class Run:
    command: str
    workdir: PurePosixPath


@dataclass
class Image:
    """What a one-stage Dockerfile builds, as far as the tests need it."""

    base: str = ""
    copies: list[Copy] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: PurePosixPath = PurePosixPath("/")
    user: str = "root"
    cmd: list[str] = field(default_factory=list)

    def installed_from(self) -> PurePosixPath:
        """The directory `pip install` builds the package from."""
        run, path, _ = self._install()
        return run.workdir / path

    def extras(self) -> set[str]:
        """The extras `pip install` installs the package with."""
        return set(filter(None, self._install()[2].split(",")))

    def _install(self) -> tuple[Run, str, str]:
        [(run, path, extras)] = [
            (run, found[1], found[2] or "")
            for run in self.runs
            if (found := re.search(r"\bpip install \"?([^\s\"\[]+)(?:\[([\w,]+)\])?", run.command))
        ]
        return run, path, extras


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) in order; comment lines go first, then continuations are joined,
    as Docker does (a comment inside a continued instruction does not end it)."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def read_image(text: str) -> Image:
    image = Image()
    for keyword, rest in instructions(text):
        if keyword == "FROM":
            assert not image.base, "a second stage: these tests read one-stage Dockerfiles"
            image.base = rest
        elif keyword == "WORKDIR":
            image.workdir = image.workdir / rest
        elif keyword == "ENV":
            image.env.update(_env(rest))
        elif keyword == "COPY":
            image.copies.append(_copy(rest, image.workdir))
        elif keyword == "RUN":
            image.runs.append(Run(rest, image.workdir))
        elif keyword == "USER":
            image.user = rest
        elif keyword == "CMD":
            assert rest.startswith("["), "CMD in shell form: it would not get SIGTERM"
            image.cmd = json.loads(rest)
        else:
            assert keyword in ("EXPOSE", "LABEL", "ARG"), keyword
    return image


def _env(arguments: str) -> dict[str, str]:
    words = shlex.split(arguments)
    if "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}  # the legacy `ENV KEY value` form
    return dict(word.split("=", 1) for word in words)


def _copy(arguments: str, workdir: PurePosixPath) -> Copy:
    words = json.loads(arguments) if arguments.startswith("[") else shlex.split(arguments)
    flags = [word for word in words if word.startswith("--")]
    assert not [flag for flag in flags if flag.startswith("--from")], "COPY --from: not read here"
    *sources, destination = [word for word in words if not word.startswith("--")]
    into = destination.endswith("/") or len(sources) > 1
    return Copy(tuple(sources), workdir / destination, into)


def dockerfile() -> Image:
    return read_image((ROOT / "Dockerfile").read_text())


def dockerignore(context: Path) -> Callable[[str], bool]:
    """Whether .dockerignore keeps a context path (relative, with /) out of the build.

    Docker's patterns: `*` and `?` stay within one path segment, `**` spans any number, and a
    directory that matches takes its contents with it. Exceptions (`!`) are not read here."""
    patterns = []
    for line in (context / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            assert not line.startswith("!"), f"an exception pattern, not read here: {line}"
            regex = ""
            for part in re.split(r"(\*\*/|\*\*|\*|\?)", line.strip("/")):
                regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                    part, re.escape(part)
                )
            patterns.append(re.compile(regex))

    def ignored(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        return any(pattern.fullmatch(prefix) for pattern in patterns for prefix in prefixes)

    return ignored


def in_image(target: Path, path: PurePosixPath) -> Path:
    """Where an image path lies in a laid-out image."""
    return target / path.relative_to("/")


def lay_out(image: Image, context: Path, target: Path) -> None:
    """Copy what the image's COPY lines take from `context` into `target`, as it lands in the
    image: a directory's contents into the destination, links kept as links, what
    .dockerignore names left out."""
    ignored = dockerignore(context)

    def skip(directory: str, names: list[str]) -> set[str]:
        relative = Path(directory).relative_to(context).as_posix()
        prefix = "" if relative == "." else f"{relative}/"
        return {name for name in names if ignored(prefix + name)}

    for copy in image.copies:
        for source in copy.sources:
            assert not ignored(source), f"{source} is in .dockerignore"
            origin, landing = context / source, in_image(target, copy.destination)
            if origin.is_dir():
                shutil.copytree(origin, landing, symlinks=True, ignore=skip, dirs_exist_ok=True)
            else:
                landing = landing / origin.name if copy.into else landing
                landing.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, landing)


@pytest.fixture(scope="module")
def image() -> Image:
    return dockerfile()


@pytest.fixture(scope="module")
def laid_out(image: Image, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("image")
    lay_out(image, ROOT, target)
    return target


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_image_is_python_311_slim_and_runs_as_a_non_root_user(image: Image) -> None:
    assert image.base == "python:3.11-slim"
    assert image.user not in ("root", "0")
    creates = [run.command.split() for run in image.runs if run.command.startswith("useradd ")]
    assert [words[-1] for words in creates] == [image.user]
    assert image.cmd == ["bandgate", "gateway", "--host", "0.0.0.0"]


def test_every_copied_path_exists_and_reaches_the_build() -> None:
    ignored = dockerignore(ROOT)
    for copy in dockerfile().copies:
        for source in copy.sources:
            assert (ROOT / source).exists(), source
            assert not ignored(source), source


def test_the_package_sources_hold_every_floor_bandgate_links_to(
    image: Image, laid_out: Path
) -> None:
    """bandgate/ reaches each floor through a link (bandgate/core -> ../core): COPY keeps the
    link, so without the floor beside it the wheel built from the image holds no modules."""
    sources = in_image(laid_out, image.installed_from())
    links = {path.name: path for path in (ROOT / "bandgate").iterdir() if path.is_symlink()}
    assert set(links) == set(FLOORS)
    for name, link in links.items():
        copied = sources / "bandgate" / name
        assert copied.is_symlink(), name
        assert copied.readlink() == link.readlink(), name
        floor = copied.resolve()
        assert floor.is_relative_to(laid_out), f"{name} points out of the image"
        original = link.resolve()
        modules = {path.relative_to(floor) for path in floor.rglob("*.py")}
        assert modules == {path.relative_to(original) for path in original.rglob("*.py")}
        assert (floor / "py.typed").is_file(), name
    assert (sources / "bandgate" / "__init__.py").is_file()


def test_the_package_sources_hold_what_pyproject_names(image: Image, laid_out: Path) -> None:
    """setuptools refuses to build without the readme; package data that is missing is
    left out of the wheel silently (the console's page, here)."""
    sources = in_image(laid_out, image.installed_from())
    project = pyproject()
    assert (sources / "pyproject.toml").read_text() == (ROOT / "pyproject.toml").read_text()
    assert (sources / project["project"]["readme"]).is_file()
    package_data: dict[str, list[str]] = project["tool"]["setuptools"]["package-data"]
    for package, patterns in package_data.items():
        if package == "*":
            continue
        directory = sources / package.replace(".", "/")
        for pattern in patterns:
            assert list(directory.glob(pattern)), f"{package}: nothing matches {pattern}"
    assert "console_assets/*.html" in package_data["bandgate.gateway"]


def test_the_image_installs_the_gateway_and_the_otlp_exporter(image: Image) -> None:
    """The image's command is the gateway; compose sends its traces to a collector."""
    extras = pyproject()["project"]["optional-dependencies"]
    assert image.extras() == {"all"}
    assert extras["all"] == ["bandgate[gateway,otlp]"]


def test_the_sources_are_built_outside_the_working_directory_and_removed(
    image: Image, laid_out: Path
) -> None:
    """A `bandgate` folder left in /app would be the one `python` started there imports,
    beside the installed package."""
    sources = image.installed_from()
    assert not sources.is_relative_to(image.workdir)
    [install] = [run for run in image.runs if "pip install" in run.command]
    assert f"rm -rf {sources}" in install.command
    assert not (in_image(laid_out, image.workdir) / "bandgate").exists()


def test_the_commands_are_entry_points_of_the_package(
    image: Image, services: dict[str, dict[str, Any]]
) -> None:
    scripts = pyproject()["project"]["scripts"]
    assert image.cmd[0] in scripts
    for name in ("gateway", "worker"):
        assert shlex.split(command(services[name]))[0] in scripts


def test_the_topology_the_image_names_is_the_shipped_one(
    image: Image, laid_out: Path, services: dict[str, dict[str, Any]]
) -> None:
    path = PurePosixPath(image.env["BANDGATE_TOPOLOGY"])
    assert load_topology(in_image(laid_out, path)) == load_topology(ROOT / "bandgate.toml")
    for name in ("gateway", "worker"):
        assert services[name]["environment"]["BANDGATE_TOPOLOGY"] == str(path)


def module_file(directory: Path, module: str) -> Path | None:
    """The file `import module` loads with `directory` first on sys.path, if there is one."""
    base = directory.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_the_workers_module_is_in_the_working_directory(
    image: Image, laid_out: Path, services: dict[str, dict[str, Any]]
) -> None:
    """`bandgate worker module:app` imports the module from its working directory."""
    target = shlex.split(command(services["worker"]))[2]
    module = target.partition(":")[0]
    workdir = in_image(laid_out, image.workdir)
    found = module_file(workdir, module)
    assert found is not None, f"{module} is not in the image's {image.workdir}"
    assert found.read_text() == (ROOT / found.relative_to(workdir)).read_text()
    for parent in module.split(".")[:-1]:
        assert module_file(workdir, parent) is not None, parent
