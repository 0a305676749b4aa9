"""Debian roots holding other RabbitMQ versions, for running private nodes of those versions.

Debian 12 ships RabbitMQ 3.10 only; trixie ships 4.0 and sid 4.3. A root made by `debootstrap`
holds a version's server, Erlang and libraries; `gateway.local_broker.LocalBroker(root=...)`
runs a node from it. Roots are cached under `.bandgate/roots/<suite>`, built once (one to three
minutes each), under a lock so that parallel test sessions build a suite only once.

    python -m tools.broker_roots            # every version the host does not have installed
    python -m tools.broker_roots 4.3        # one version
    python -m tools.broker_roots --rebuild 4.3   # sid moves: fetch today's sid
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bandgate.ops.local_broker import installed_version

# RabbitMQ minor version -> the Debian suite that ships it (checked after each build).
SUITES = {"3.10": "bookworm", "4.0": "trixie", "4.3": "sid"}
ROOTS_DIR = Path(__file__).resolve().parent.parent / ".bandgate" / "roots"
MIRROR = os.environ.get("BANDGATE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BUILD_TIMEOUT = 30 * 60


class RootError(RuntimeError):
    """A root could not be built, or holds another RabbitMQ version than asked for."""


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _matches(found: str | None, version: str) -> bool:
    return found is not None and (found == version or found.startswith(version + "."))


def root_for(version: str) -> Path | None:
    """The root to run `version` from, built if missing; None when the host has it installed."""
    if version not in SUITES:
        raise RootError(f"unknown RabbitMQ version {version!r}: choose one of {', '.join(SUITES)}")
    if _matches(installed_version(), version):
        return None
    return ensure_root(version)


def root_path(version: str) -> Path:
    return ROOTS_DIR / SUITES[version]


def ensure_root(version: str, rebuild: bool = False) -> Path:
    """The root of `version`'s suite; builds it unless a finished one is there already."""
    suite, root = SUITES[version], root_path(version)
    with _lock(suite):
        if root.is_dir() and not rebuild:
            _check_version(root, suite, version)
            return root
        started = time.monotonic()
        _say(f"building the Debian {suite} root for RabbitMQ {version} in {root} (1-3 min)")
        partial = _bootstrap(suite, version)
        if root.exists():
            retired = root.with_name(f"{suite}.old")
            _remove_tree(retired)
            root.rename(retired)
            _remove_tree(retired)
        partial.rename(root)
        found = installed_version(root)
        _say(f"{suite}: RabbitMQ {found} ready in {root} ({time.monotonic() - started:.0f} s)")
        return root


@contextmanager
def _lock(suite: str) -> Iterator[None]:
    ROOTS_DIR.mkdir(parents=True, exist_ok=True)
    with (ROOTS_DIR / f"{suite}.lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"waiting for another process building the {suite} root")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _bootstrap(suite: str, version: str) -> Path:
    """debootstrap into `<suite>.partial`; it becomes the root only once complete and checked."""
    partial = ROOTS_DIR / f"{suite}.partial"
    _remove_tree(partial)  # a build killed half-way left it
    log = ROOTS_DIR / f"{suite}.log"
    command = [
        _debootstrap(),
        "--variant=minbase",
        "--include=rabbitmq-server",
        suite,
        str(partial),
        MIRROR,
    ]
    # A private mount namespace: the /proc and /sys that debootstrap mounts inside the root
    # vanish with it even when it is killed, so no mount is ever left for `rm -rf` to follow.
    with log.open("w") as out:
        result = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--", *command],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    if result.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
        _remove_tree(partial)
        raise RootError(
            f"cannot bootstrap Debian {suite} for RabbitMQ {version}: debootstrap exited "
            f"{result.returncode} (a moving suite such as sid is sometimes uninstallable "
            f"for a day). Full log: {log}. Its end:\n{tail}"
        )
    # Erlang resolves `localhost` through the root's own /etc/hosts.
    shutil.copyfile("/etc/hosts", partial / "etc" / "hosts")
    for package in (partial / "var/cache/apt/archives").glob("*.deb"):
        package.unlink()  # ~100 MB of downloads nobody needs again
    _check_version(partial, suite, version)
    if not (partial / "lib").is_symlink():
        raise RootError(f"the {suite} root has no merged /usr; LocalBroker needs one")
    return partial


def _check_version(root: Path, suite: str, version: str) -> None:
    found = installed_version(root)
    if not _matches(found, version):
        raise RootError(
            f"Debian {suite} in {root} holds RabbitMQ {found or 'nothing'}, not {version}.x: "
            f"the suite moved on (rebuild with `python -m tools.broker_roots --rebuild "
            f"{version}`, or map {version} to another suite in tools/broker_roots.py)"
        )


def _debootstrap() -> str:
    found = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin")
    if found:
        return found
    _say("installing debootstrap")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], check=True, env=env)
    return shutil.which("debootstrap", path="/usr/sbin:/usr/bin") or "debootstrap"


def _remove_tree(path: Path) -> None:
    """rm -rf, refused while anything is mounted under `path` (it would delete the host's
    /dev through a bind mount)."""
    if not path.exists():
        return
    inside = str(path.resolve()) + "/"
    with open("/proc/self/mountinfo") as mounts:
        busy = [line.split()[4] for line in mounts if line.split()[4].startswith(inside)]
    if busy:
        raise RootError(f"not removing {path}: {', '.join(busy)} mounted inside; unmount first")
    shutil.rmtree(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("versions", nargs="*", help=f"of {', '.join(SUITES)}; default: all")
    parser.add_argument("--rebuild", action="store_true", help="bootstrap again even if cached")
    args = parser.parse_args(argv)
    host = installed_version()
    failed = []
    for version in args.versions or list(SUITES):
        if version not in SUITES:
            parser.error(f"unknown version {version!r}: choose from {', '.join(SUITES)}")
        if _matches(host, version):
            _say(f"{version}: installed on this host (RabbitMQ {host}), no root needed")
            continue
        try:
            root = ensure_root(version, rebuild=args.rebuild)
        except (RootError, subprocess.SubprocessError) as error:
            _say(f"{version}: {error}")
            failed.append(version)
            continue
        print(f"{version}: RabbitMQ {installed_version(root)} in {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
