"""docs/deploy/sizing.md holds exactly the tables `bench.sizing_model` prints, so the figures
and the plan in the doc cannot drift from the model and its sources."""

from __future__ import annotations

import re
from pathlib import Path

from bench import sizing_model

DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy" / "sizing.md"


def block(name: str) -> str:
    text = DOC.read_text()
    found = re.search(
        rf"<!-- sizing-model:{name} -->\n(.*?)\n<!-- /sizing-model:{name} -->", text, re.S
    )
    assert found is not None, f"no sizing-model:{name} block in {DOC}"
    return found.group(1)


def test_the_cost_tables_are_the_models() -> None:
    assert block("costs") == sizing_model.costs_section()


def test_the_plans_are_the_models() -> None:
    assert block("plans") == sizing_model.plans_section()


def test_the_plan_grows_with_the_load_and_never_drops_below_three_nodes() -> None:
    costs = sizing_model.MEASURED["4.3.6"][1024]
    plans = [
        sizing_model.plan(rate, costs, sizing_model.Assumptions()) for rate in (10, 10_000, 100_000)
    ]
    assert plans[0].nodes == 3
    assert plans[0].nodes <= plans[1].nodes <= plans[2].nodes
    assert plans[2].shards > plans[1].shards


def test_network_counts_each_byte_between_nodes_once_per_side() -> None:
    # Three nodes, 1 byte/s: forward 2/3, replicate 2, deliver forward 2/3, clients 1 -> /3.
    assert abs(sizing_model.network_bytes_per_node(1, 1, 3) - (2 + 4 / 3 + 1) / 3) < 1e-9
