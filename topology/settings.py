"""Settings every bandgate process shares, from `BANDGATE_*` environment variables.

Which broker: `BANDGATE_AMQP_URL` when set; else the one `bandgate dev` (`make run`) recorded
in `.bandgate/dev.json` in this directory or above (`dev_record`); else RabbitMQ's default
address. `broker_source` says which, so every connection error can name the broker it tried
and the setting that picked it.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, PrivateAttr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from bandgate.topology.dev_record import find_record
from bandgate.topology.loader import DEFAULT_TOPOLOGY_PATH, load_topology
from bandgate.topology.model import Topology

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
AMQP_URL_ENV = "BANDGATE_AMQP_URL"


def node_urls(amqp_url: str) -> tuple[str, ...]:
    """The addresses of a `BANDGATE_AMQP_URL`: one URL, or a cluster's nodes separated by
    commas (`core.cluster_connection` moves between them)."""
    urls = tuple(part.strip() for part in amqp_url.split(",") if part.strip())
    return urls or (amqp_url,)


def redact(url: str) -> str:
    """`url` (or a comma-separated list of them) with passwords replaced by `***`."""
    if "," in url:
        return ",".join(redact(part) for part in node_urls(url))
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class BrokerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BANDGATE_", extra="ignore")

    amqp_url: str = Field(
        default=DEFAULT_AMQP_URL,
        description="AMQP URL of the broker, including the vhost, or the URLs of a cluster's "
        "nodes separated by commas (default: the broker `bandgate dev` recorded in "
        ".bandgate/dev.json, else amqp://guest:guest@127.0.0.1:5672/)",
    )
    management_url: str | None = Field(
        default=None,
        description="management API base URL (http://user:pass@host:15672); optional, "
        "adds unacked counts and full conflict reports",
    )
    topology: Path = Field(
        default=Path(DEFAULT_TOPOLOGY_PATH), description="path of the topology TOML file"
    )
    _broker_source: str = PrivateAttr(default=AMQP_URL_ENV)
    _defaulted: bool = PrivateAttr(default=False)
    _dev_running: bool | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _pick_broker(self) -> BrokerSettings:
        """Fill the broker from `bandgate dev`'s record when nobody chose one."""
        if "amqp_url" in self.model_fields_set:
            if os.environ.get(AMQP_URL_ENV) != self.amqp_url:
                self._broker_source = "the URL given explicitly"
            return self
        found = find_record()
        if found is None:
            self._broker_source = f"the default ({AMQP_URL_ENV} is not set)"
            self._defaulted = True
            return self
        path, record = found
        self.amqp_url = record.amqp_url
        if "management_url" not in self.model_fields_set:
            self.management_url = record.management_url
        self._broker_source = f"{path}, written by `bandgate dev` ({AMQP_URL_ENV} overrides it)"
        self._dev_running = record.running
        return self

    @property
    def broker_source(self) -> str:
        """The setting that chose `amqp_url`, in words."""
        return self._broker_source

    @property
    def chosen(self) -> bool:
        """Whether somebody chose the broker (a URL or `bandgate dev`), not the default."""
        return not self._defaulted

    def describe_broker(self) -> str:
        """`amqp://guest:***@host:port/ (from <setting>)`, with a hint when it cannot be up."""
        hint = ""
        if self._dev_running is False:
            hint = "; `bandgate dev` is not running: start it with `make run`"
        elif not self.chosen:
            hint = f"; start one with `make run`, or set {AMQP_URL_ENV}"
        return f"{redact(self.amqp_url)} (from {self._broker_source}{hint})"

    def load_topology(self) -> Topology:
        return load_topology(self.topology)


__all__ = ["AMQP_URL_ENV", "DEFAULT_AMQP_URL", "BrokerSettings", "node_urls", "redact"]
