"""The priority benchmark's plumbing that needs no broker: the classic-bands topology, the
choice of contenders, the paced loop, the threaded recorder, the columns and the plot."""

from __future__ import annotations

import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest

from bandgate.topology.loader import load_topology, parse_topology
from bench.classic_bands import QUEUE, section
from bench.peers.base import LockedRecorder, PeerConfig, pace
from bench.priority import _chooser, _with_ratio_columns

ROOT = Path(__file__).resolve().parents[2]


def test_classic_bands_copy_orders_bands_as_classic_queues() -> None:
    orders = load_topology(ROOT / "bandgate.toml").queue("orders")
    variant = parse_topology(tomllib.loads(section(orders))).queue(QUEUE)
    assert [band.type for band in variant.bands] == ["classic"] * len(orders.bands)
    assert [(b.name, b.priorities, b.age_after_seconds) for b in variant.bands] == [
        (b.name, b.priorities, b.age_after_seconds) for b in orders.bands
    ]


def test_only_chooses_contenders_by_words_in_their_names() -> None:
    names = ["bandgate bands", "bandgate classic bands", "Celery -Q hot,warm,cold", "naive bands"]
    assert [n for n in names if _chooser("Bandgate, celery")(n)] == names[:3]
    assert [n for n in names if _chooser(None)(n)] == names


def test_ratio_columns_follow_the_max() -> None:
    row = _with_ratio_columns({"name": "a", "p99_ms": 1.0, "max_ms": 2.0, "cold_msg_s": 3.0})
    assert list(row) == ["name", "p99_ms", "max_ms", "vs_c16", "vs_c32", "cold_msg_s"]


def test_pace_sends_the_warmup_then_the_measured_messages(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = PeerConfig(kind="test", url="", rate=500.0, warmup_seconds=0.01, seconds=0.02, run="r")
    payloads: list[dict[str, Any]] = []
    sent = pace(config, payloads.append)
    assert [p["seq"] for p in payloads] == list(range(-5, 10))
    assert sorted(sent) == list(range(10))
    assert all(p["run"] == "r" and p["t"] == sent[p["seq"]] for p in payloads[5:])
    assert capsys.readouterr().out == "measuring\nsent\n"


def test_locked_recorder_counts_every_message_of_many_threads(tmp_path: Path) -> None:
    recorder = LockedRecorder(PeerConfig(kind="test", url="", run="r"))

    def handle(thread: int) -> None:
        for n in range(2000):
            recorder.record({"data": "cold"})
            recorder.record({"seq": thread * 10_000 + n, "t": 0.0, "run": "r"})

    threads = [threading.Thread(target=handle, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    recorder.write(str(tmp_path / "out.json"))
    assert recorder.handled == 32_000
    assert sum(recorder.background.values()) == 16_000
    assert len(recorder.waits) == 16_000


def test_pareto_plot_is_a_png_with_a_panel_per_load(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from bench.pareto import plot

    runs = {
        "a": [{"p99_ms": 5.0, "cold_msg_s": 900.0}, {"p99_ms": 7.0, "cold_msg_s": 950.0}],
        "b": [{"p99_ms": 900.0, "cold_msg_s": 1200.0}],
    }
    medians = {"a": runs["a"][0], "b": runs["b"][0]}
    out = tmp_path / "pareto.png"
    plot([("light", runs, medians), ("saturating", runs, medians)], "title", out)
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
