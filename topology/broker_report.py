"""What the broker check finds: findings, the order each band keeps, and the report that holds
them.

Kept apart from the checks so that the rules (policies, conflicts) and their callers (start-up,
`bandgate doctor`) share one vocabulary without depending on how the broker is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bandgate.topology.loader import TopologyError

Severity = Literal["error", "warning", "info"]


def listed(names: Sequence[str], most: int = 5) -> str:
    """The first `most` names, then how many more: fit for a finding's one line."""
    more = len(names) - most
    return ", ".join(names[:most]) + (f" and {more} more" if more > 0 else "")


class BrokerCheckError(TopologyError):
    """The broker's configuration would lose or loop messages; the message lists why."""


@dataclass(frozen=True)
class Finding:
    severity: Severity
    code: str
    subject: str  # what it is about: a queue, a policy, the broker
    message: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.message}"

    @classmethod
    def error(cls, code: str, subject: str, message: str) -> Finding:
        return cls("error", code, subject, message)

    @classmethod
    def warning(cls, code: str, subject: str, message: str) -> Finding:
        return cls("warning", code, subject, message)

    @classmethod
    def info(cls, code: str, subject: str, message: str) -> Finding:
        return cls("info", code, subject, message)


@dataclass(frozen=True)
class BandOrdering:
    queue: str
    band: str
    rabbitmq_queue: str
    queue_type: str
    ordering: str  # "FIFO within band", "two levels within band", ...
    detail: str


@dataclass(frozen=True)
class BrokerReport:
    version: str
    product: str
    cluster_name: str | None
    erlang_version: str | None
    management_version: str | None
    capabilities: tuple[str, ...]
    ordering: tuple[BandOrdering, ...]
    findings: tuple[Finding, ...]

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "warning")

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        erlang = f" on Erlang {self.erlang_version}" if self.erlang_version else ""
        cluster = f", cluster {self.cluster_name!r}" if self.cluster_name else ""
        api = (
            f", management API {self.management_version}"
            if self.management_version
            else ", no management API"
        )
        return f"{self.product} {self.version}{erlang}{cluster}{api}"

    def raise_for_errors(self) -> None:
        """Raise `BrokerCheckError` naming every error, when there is one."""
        if self.errors:
            problems = "; ".join(str(finding) for finding in self.errors)
            raise BrokerCheckError(
                f"RabbitMQ {self.version} has a configuration that would lose or loop "
                f"messages: {problems}"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "product": self.product,
            "cluster_name": self.cluster_name,
            "erlang_version": self.erlang_version,
            "management_version": self.management_version,
            "capabilities": list(self.capabilities),
            "ordering": [vars(item) for item in self.ordering],
            "findings": [vars(item) for item in self.findings],
            "ok": self.ok,
        }


__all__ = ["BandOrdering", "BrokerCheckError", "BrokerReport", "Finding", "listed"]
