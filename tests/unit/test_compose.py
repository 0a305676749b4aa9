"""docker-compose.yml and the Dockerfile, checked by reading them (no Docker engine here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from bandgate.topology import export

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


def test_rabbitmq_is_4x_with_the_committed_config_mounted(
    services: dict[str, dict[str, Any]],
) -> None:
    rabbitmq = services["rabbitmq"]
    assert re.fullmatch(r"rabbitmq:4\.\d+-management", rabbitmq["image"])
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


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_the_image_installs_bandgate_and_runs_as_a_non_root_user() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    assert "pip install ." in runs
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users
    assert users[-1] not in ("root", "0")
    assert instructions[-1] == ("CMD", '["bandgate", "gateway", "--host", "0.0.0.0"]')
    ignored = (ROOT / ".dockerignore").read_text().split()
    copied = [rest.split()[0] for keyword, rest in instructions if keyword == "COPY"]
    assert (ROOT / "examples" / "worker.py").is_file()  # `bandgate worker examples.worker:app`
    for source in copied:
        assert (ROOT / source).exists(), source
        assert source not in ignored, source
