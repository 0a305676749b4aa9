"""A private RabbitMQ node started from the locally installed `rabbitmq-server` (or a root).

Used by `bandgate dev`, the test session and the benchmarks when no broker is configured:
its own node name, ports, cookie and data directory, so it never touches a system broker.

With `root` (default: `BANDGATE_RABBITMQ_ROOT`) the node runs another RabbitMQ version from a
Debian root built by `tools/broker_roots.py`: the root's /usr and /etc are bound over the host's
in a private mount namespace, so every other path (data, config, definitions files) means the
same inside and out, and the binds vanish with the node's last process, even after a SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
CTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
QUEUES = Path("/usr/lib/rabbitmq/bin/rabbitmq-queues")
DEFAULT_PLUGINS = ("rabbitmq_management", "rabbitmq_consistent_hash_exchange")
ROOT_ENV = "BANDGATE_RABBITMQ_ROOT"
# `sh -c` body run in the new mount namespace: $0 is the root, "$@" the command to run in it.
# /usr carries the root's programs and libraries (the host's /bin and /lib link into it), /etc
# its dynamic-linker cache, alternatives and the copied hosts file.
_IN_ROOT = 'mount --bind "$0/usr" /usr && mount --bind "$0/etc" /etc && exec "$@"'


# Where a node's quorum queues' write-ahead log rolls over (RabbitMQ's default: 512 MiB). At the
# default, a rollover had the segment writer write ~100 MB out at once, and every quorum queue's
# deliveries stalled for 100-260 ms meanwhile; at 64 MiB it rolls over in small steps, with no
# such stall seen (docs/explanation/design.md, "What stalls"). It also bounds the memory the
# WAL's tables take.
QUORUM_WAL_MAX_SIZE_BYTES = 64 * 1024 * 1024

# A private node shares its machine's cores with the gateway, the workers and the tests, and an
# Erlang scheduler with nothing to do spins a while before it sleeps (RabbitMQ's runtime guide,
# "busy waiting"): CPU taken from the Python processes beside it. Without the spin, hot
# messages' p99 under a fair band's flood came nearer to fairness off's on two cores
# (docs/guides/tenants.md, "Figures").
NO_BUSY_WAIT = "+sbwt none +sbwtdcpu none +sbwtdio none"

# RabbitMQ 4.3 gave quorum queues a Ra system of their own, sized by
# `quorum_queue.wal_max_size_bytes`, and no longer applies `raft.wal_max_size_bytes` to it
# (seen: a 158 MB WAL under a 64 MiB `raft.` setting); before 4.3 only the `raft.` key exists,
# and a node refuses a key its schema lacks. `tests/integration/test_private_node.py` reads the
# size back from running 3.10.8, 4.0.5 and 4.3.6 nodes.
QUORUM_QUEUE_WAL_KEY_SINCE = (4, 3)
SERVER_LIB = Path("usr/lib/rabbitmq/lib")


class LocalBrokerError(RuntimeError):
    """The private node could not be started or controlled."""


_handed_out: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now, never the same one twice in this process: the kernel
    can hand a just-closed port out again, and three nodes of a test cluster started at once
    then collided on one (the loser exits with eaddrinuse while the winner answers its port)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def rabbitmq_installed(root: Path = Path("/")) -> bool:
    return all((root / path.relative_to("/")).exists() for path in (SERVER, CTL))


def installed_version(root: Path = Path("/")) -> str | None:
    """The RabbitMQ version installed under `root` (e.g. "4.0.5"), from its library folder."""
    found = sorted((root / SERVER_LIB).glob("rabbitmq_server-*"))
    return found[-1].name.removeprefix("rabbitmq_server-") if found else None


def quorum_wal_key(version: str) -> str:
    """The rabbitmq.conf key that sizes quorum queues' WAL on RabbitMQ `version` ("4.3.6", or
    "4.3" for an image tag)."""
    major, minor = (int(part) for part in version.split(".")[:2])
    own = (major, minor) >= QUORUM_QUEUE_WAL_KEY_SINCE
    return "quorum_queue.wal_max_size_bytes" if own else "raft.wal_max_size_bytes"


def quorum_wal_setting(root: Path | None, size: int) -> str:
    """The rabbitmq.conf line that sizes the quorum queues' WAL on the node installed in `root`."""
    version = installed_version(root or Path("/"))
    return f"{quorum_wal_key(version or '0.0')} = {size}"


def configured_root() -> Path | None:
    """The root named by `BANDGATE_RABBITMQ_ROOT`, read when a node is made: the test harness
    sets it once, so that every node of the session (fault tests' own ones too) runs it."""
    value = os.environ.get(ROOT_ENV)
    return Path(value) if value else None


@dataclass
class LocalBroker:
    """One private node; `start()` returns once AMQP (and management) accept connections."""

    base_dir: Path
    name: str = "bandgate"
    amqp_port: int = field(default_factory=free_port)
    management_port: int = field(default_factory=free_port)
    dist_port: int = field(default_factory=free_port)
    prometheus_port: int = field(default_factory=free_port)
    plugins: tuple[str, ...] = DEFAULT_PLUGINS
    root: Path | None = field(default_factory=configured_root)
    # None: RabbitMQ's own default (512 MiB), for the benchmarks' broker studies.
    quorum_wal_max_size_bytes: int | None = QUORUM_WAL_MAX_SIZE_BYTES
    settings: tuple[str, ...] = ()  # more rabbitmq.conf lines (the benchmarks' broker studies)
    advanced: str = ""  # an advanced.config term, for settings rabbitmq.conf has no key for
    erl_args: str = NO_BUSY_WAIT  # Erlang VM flags ("": RabbitMQ's own, busy waiting on)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.root is not None:
            self.root = self.root.resolve()  # the node runs in base_dir: a relative root breaks

    @property
    def node(self) -> str:
        return f"{self.name}@localhost"

    @property
    def amqp_url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/"

    @property
    def management_url(self) -> str:
        return f"http://guest:guest@127.0.0.1:{self.management_port}"

    @property
    def log_file(self) -> Path:
        return self.base_dir / "server.log"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            HOME=str(self.base_dir),
            RABBITMQ_CONF_ENV_FILE=str(self.base_dir / "rabbitmq-env.conf"),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_CONFIG_FILE=str(self.base_dir / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.base_dir / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(self.base_dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.base_dir / "log"),
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        if self.erl_args:
            env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] = self.erl_args
        if self.advanced:
            env["RABBITMQ_ADVANCED_CONFIG_FILE"] = str(self.base_dir / "advanced.config")
        return env

    def _command(self, program: Path, *args: str) -> list[str]:
        if self.root is None:
            return [str(program), *args]
        unshare = ["unshare", "--mount", "--propagation", "private", "--"]
        return [*unshare, "/bin/sh", "-c", _IN_ROOT, str(self.root), str(program), *args]

    def _check_installed(self) -> None:
        if self.root is None:
            if not rabbitmq_installed():
                raise LocalBrokerError(
                    f"{SERVER} not found: install RabbitMQ (apt-get install rabbitmq-server) "
                    "or set BANDGATE_AMQP_URL to a broker"
                )
        elif not rabbitmq_installed(self.root):
            raise LocalBrokerError(
                f"no RabbitMQ in the root {self.root}: build it with `make broker-roots`"
            )
        elif not Path("/lib").is_symlink():
            raise LocalBrokerError("running from a root needs a host with a merged /usr")

    def _write_config(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        (self.base_dir / "rabbitmq-env.conf").write_text("")
        lines = [
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}",
            "loopback_users = none",
        ]
        if "rabbitmq_management" in self.plugins:
            lines += [
                f"management.tcp.port = {self.management_port}",
                "management.tcp.ip = 127.0.0.1",
            ]
        if "rabbitmq_prometheus" in self.plugins:
            # Two nodes on the default 15692 make each other's boot crash.
            lines += [
                f"prometheus.tcp.port = {self.prometheus_port}",
                "prometheus.tcp.ip = 127.0.0.1",
            ]
        if self.quorum_wal_max_size_bytes is not None:
            lines.append(quorum_wal_setting(self.root, self.quorum_wal_max_size_bytes))
        lines += self.settings
        (self.base_dir / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        if self.advanced:
            (self.base_dir / "advanced.config").write_text(self.advanced + "\n")
        (self.base_dir / "enabled_plugins").write_text(f"[{','.join(self.plugins)}].\n")
        cookie = self.base_dir / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(secrets.token_hex(16).upper())
            cookie.chmod(0o400)

    def start(self, timeout: float = 90.0) -> LocalBroker:
        self._check_installed()
        for port in (self.amqp_port, self.management_port, self.dist_port):
            if port_open(port):
                raise LocalBrokerError(f"port {port} is already in use on 127.0.0.1")
        self._write_config()
        log = self.log_file.open("ab")
        self.process = subprocess.Popen(
            self._command(SERVER),
            env=self._env(),
            cwd=self.base_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in a terminal must not kill the node mid-write
        )
        log.close()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        ports = [self.amqp_port]
        if "rabbitmq_management" in self.plugins:
            ports.append(self.management_port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise LocalBrokerError(f"RabbitMQ node {self.node} exited: {self._log_tail()}")
            if all(port_open(port) for port in ports):
                return
            time.sleep(0.1)
        raise LocalBrokerError(f"RabbitMQ node {self.node} not ready in {timeout:.0f}s")

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_file.read_text(errors="replace")[-2000:]
        return "(no log)"

    def ctl(self, *args: str, timeout: float = 60.0, program: Path = CTL) -> str:
        """Run rabbitmqctl (or another of RabbitMQ's tools, `QUEUES`) against this node."""
        result = subprocess.run(
            self._command(program, "-n", self.node, *args),
            env=self._env(),
            cwd=self.base_dir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise LocalBrokerError(f"{program.name} {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def stop_app(self) -> None:
        """Stop RabbitMQ inside the node (clients see the broker go away); fast to undo."""
        self.ctl("stop_app")

    def start_app(self, timeout: float = 60.0) -> None:
        self.ctl("start_app")
        self.wait_ready(timeout)

    def stop(self, timeout: float = 60.0) -> None:
        """Shut the node down cleanly (SIGTERM makes RabbitMQ stop gracefully)."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self.process = None

    def kill(self) -> None:
        """SIGKILL the node: what a crash or power loss looks like to clients."""
        process = self.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        self.process = None
        _wait_closed((self.amqp_port, self.management_port, self.dist_port), 30)


def stop_left_running(pid: int, timeout: float = 60.0) -> bool:
    """Stop a node that an earlier process started and left running (it was killed itself):
    SIGTERM to the node's process group, as `LocalBroker.stop` sends, then wait for it to go.
    `pid` is the group's leader, the `rabbitmq-server` script; a pid that the system has given
    to another program since is left alone. True if there was such a node."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if b"rabbitmq" not in command:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _group_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    return True


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs; zombies do not count (an orphan's parent
    may be an init that never reaps them, and a zombie still answers signal 0)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ")".
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def _wait_closed(ports: tuple[int, ...], timeout: float) -> None:
    """The script that `wait()` reaps dies before the Erlang VM: a `start()` right after a
    kill found the VM's ports still open for a few milliseconds."""
    deadline = time.monotonic() + timeout
    while any(port_open(port) for port in ports) and time.monotonic() < deadline:
        time.sleep(0.01)
