"""The priority benchmark as a picture: what each contender pays in hot p99 for the cold drain
rate it keeps, one panel per load. Lower is a shorter hot wait, further right a faster drain:
a contender down and to the right of another is better on both counts.

Every run is a faint point, the run the table shows (the median p99) a bold one with the
contender's name. The y axis is logarithmic: the contenders' p99s span milliseconds to
seconds. Needs matplotlib (the `bench` extra); drawn with the Agg backend, no display.

The points are kept beside the picture (`priority-pareto-<stamp>.json`), so that
`python -m bench.pareto bench/results/priority-pareto-<stamp>.json [--stable]` draws it again
without running the benchmark.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

RESULTS = Path("bench/results")
STABLE = Path("docs/priority-pareto.png")  # what docs/benchmarks.md shows
MARKERS = "osD^vP*Xhp<>"
POINT = ("p99_ms", "cold_msg_s")

# A load's runs: contender -> every run's row ("p99_ms", "cold_msg_s"), and the median run's.
Runs = dict[str, list[dict[str, Any]]]
Panel = tuple[str, Runs, dict[str, dict[str, Any]]]


def plot(loads: list[Panel], title: str, out: Path) -> None:
    """One panel per (load name, runs, median rows), written as a PNG to `out`."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot, ticker

    figure, axes = pyplot.subplots(1, len(loads), figsize=(7.5 * len(loads), 6.5), squeeze=False)
    names = list(dict.fromkeys(name for _, runs, _ in loads for name in runs))
    colours = pyplot.get_cmap("tab10")
    for panel, (load, runs, medians) in zip(axes[0], loads, strict=True):
        labels = []
        for n, name in enumerate(names):
            if name not in runs:
                continue
            colour, marker = colours(n % 10), MARKERS[n % len(MARKERS)]
            every = runs[name]
            xs = [run["cold_msg_s"] for run in every]
            ys = [max(run["p99_ms"], 0.01) for run in every]
            panel.scatter(xs, ys, color=colour, marker=marker, alpha=0.25, s=30)
            x, y = medians[name]["cold_msg_s"], max(medians[name]["p99_ms"], 0.01)
            panel.scatter(
                [x], [y], color=colour, marker=marker, s=90, edgecolors="black", label=name
            )
            labels.append((name, x, y, colour))
        panel.set_yscale("log")
        panel.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        panel.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        panel.yaxis.set_minor_formatter(ticker.NullFormatter())
        panel.set_xlabel("cold drain rate (msg/s)")
        panel.set_ylabel("hot wait p99 (ms, log scale)")
        panel.set_title(f"{load} load")
        panel.grid(True, which="both", alpha=0.3)
        panel.margins(x=0.12, y=0.08)
        _label(panel, labels, figure.dpi)
    axes[0][-1].legend(fontsize=8, loc="best")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    pyplot.close(figure)


def _label(panel: Any, labels: list[tuple[str, float, float, Any]], dpi: float) -> None:
    """Name each bold point beside it, moving a name down until it clears those already
    placed (the contenders bunch up: several within a few ms and msg/s of each other)."""
    panel.get_xlim(), panel.get_ylim()  # fixes the limits, so data maps to pixels
    line, char = 11.0, 5.0  # pixels at fontsize 8, about
    placed: list[tuple[float, float, float]] = []  # left, right, baseline
    for name, x, y, colour in sorted(labels, key=lambda label: -label[2]):
        px, py = panel.transData.transform((x, y))
        width = char * len(name)
        gap = 7.0 if px + 7 + width < panel.bbox.x1 else -7.0 - width  # left of a point on the edge
        left, right, shift = px + gap, px + gap + width, 0.0
        while any(
            left < other_right and other_left < right and abs(py + shift - base) < line
            for other_left, other_right, base in placed
        ):
            shift -= line
        placed.append((left, right, py + shift))
        panel.annotate(
            name,
            (x, y),
            xytext=((7 if gap > 0 else -7) * 72 / dpi, shift * 72 / dpi),
            textcoords="offset points",
            fontsize=8,
            color=colour,
            va="center",
            ha="left" if gap > 0 else "right",
        )


def write(panels: list[Panel], title: str, stamp: str, stable: bool) -> Path | None:
    """bench/results/priority-pareto-<stamp>.png and its points (.json), the picture copied to
    `STABLE` when `stable` (a full run); None, with a note, when matplotlib is missing."""
    out = RESULTS / f"priority-pareto-{stamp}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(_points(panels, title), indent=1))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("priority: no Pareto plot, matplotlib is missing (pip install -e '.[bench]')")
        return None
    plot(panels, title, out)
    if stable:
        STABLE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, STABLE)
    return out


def _points(panels: list[Panel], title: str) -> dict[str, Any]:
    def point(row: dict[str, Any]) -> dict[str, float]:
        return {key: row[key] for key in POINT}

    return {
        "title": title,
        "loads": [
            {
                "load": load,
                "runs": {name: [point(run) for run in done] for name, done in runs.items()},
                "medians": {name: point(row) for name, row in medians.items()},
            }
            for load, runs, medians in panels
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pareto")
    parser.add_argument("points", type=Path, help="a priority-pareto-<stamp>.json")
    parser.add_argument("--stable", action="store_true", help=f"copy the picture to {STABLE}")
    args = parser.parse_args()
    data = json.loads(args.points.read_text())
    panels = [(load["load"], load["runs"], load["medians"]) for load in data["loads"]]
    out = args.points.with_suffix(".png")
    plot(panels, data["title"], out)
    if args.stable:
        shutil.copyfile(out, STABLE)
    print(f"written {out}" + (f" and {STABLE}" if args.stable else ""))


if __name__ == "__main__":
    main()
