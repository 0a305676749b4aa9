"""What `pip install bandgate` installs: one import package, `bandgate`, with every floor.

PyPI has unrelated distributions named `consumers` and `topology`; a wheel that installed those
names at the top level would clash with them silently.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.unit.test_floors import FLOORS, ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
         "--wheel-dir", str(out), str(ROOT)],
        check=True,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(build), "PIP_NO_INPUT": "1"},
        cwd=build,
    )  # fmt: skip
    (path,) = out.glob("bandgate-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_installs_only_the_bandgate_package(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"bandgate"}


def test_the_wheel_holds_every_module_of_every_floor(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for floor in FLOORS:
        for path in (ROOT / floor).glob("*.py"):
            assert f"bandgate/{floor}/{path.name}" in names
        assert f"bandgate/{floor}/py.typed" in names


def test_the_command_line_entry_point_is_under_bandgate(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = (n for n in wheel.namelist() if n.endswith("entry_points.txt"))
    text = wheel.read(entry_points).decode()
    assert "bandgate = bandgate.ops.cli:main" in text
    assert Path(ROOT / "ops" / "cli.py").read_text().count("def main(") == 1


def test_the_wheel_ships_the_console_page(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for asset in ("console.html", "console.js", "console.css"):
        assert f"bandgate/gateway/console_assets/{asset}" in names
    for asset in ("docs.html", "redoc.standalone.js", "REDOC-LICENSE.txt"):
        assert f"bandgate/gateway/docs_assets/{asset}" in names
