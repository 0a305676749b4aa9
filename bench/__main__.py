"""`python -m bench [publish|all]`: benchmarks against the raw aio-pika client, same run."""

from __future__ import annotations

import argparse
import json
import platform
from datetime import UTC, datetime
from pathlib import Path

from bench.environment import bench_broker
from bench.publish import run_publish

RESULTS = Path("bench/results")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("which", choices=["publish", "all"], nargs="?", default="all")
    parser.add_argument("--messages", type=int, default=5000)
    args = parser.parse_args()
    with bench_broker() as broker:
        rows = run_publish(broker, args.messages)
    header = f"{'benchmark':<34}{'msg/s':>10}{'ratio':>8}{'p50 ms':>9}{'p99 ms':>9}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['name']:<34}{row['rate']:>10.0f}{row['ratio']:>8.2f}"
            f"{row.get('p50_ms', float('nan')):>9.1f}{row.get('p99_ms', float('nan')):>9.1f}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"publish-{stamp}.json"
    meta = {"date": stamp, "machine": platform.platform(), "broker": broker.version}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"\n{meta}\nwritten {out}")


if __name__ == "__main__":
    main()
