"""Settings every bandgate process shares, from `BANDGATE_*` environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from bandgate.topology.loader import DEFAULT_TOPOLOGY_PATH, load_topology
from bandgate.topology.model import Topology

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


class BrokerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BANDGATE_", extra="ignore")

    amqp_url: str = Field(
        default=DEFAULT_AMQP_URL, description="AMQP URL of the broker, including the vhost"
    )
    management_url: str | None = Field(
        default=None,
        description="management API base URL (http://user:pass@host:15672); optional, "
        "adds unacked counts and full conflict reports",
    )
    topology: Path = Field(
        default=Path(DEFAULT_TOPOLOGY_PATH), description="path of the topology TOML file"
    )

    def load_topology(self) -> Topology:
        return load_topology(self.topology)
