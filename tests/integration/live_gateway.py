"""The gateway served for real, on a port, for tests that need a socket (fuzzers)."""

from __future__ import annotations

import threading
import time

import httpx
import uvicorn

from bandgate.gateway.http_server import server_options
from bandgate.gateway.settings import GatewaySettings
from bandgate.pull.app import create_app
from bandgate.topology.model import Topology


class LiveGateway:
    """The gateway as `bandgate gateway` serves it (uvicorn with the gateway's HTTP limits),
    in a thread, on a port of its own."""

    def __init__(self, settings: GatewaySettings, topology: Topology) -> None:
        options = server_options(settings) | {"log_level": "warning"}
        self.server = uvicorn.Server(uvicorn.Config(create_app(settings, topology), **options))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://{settings.host}:{settings.port}"

    def __enter__(self) -> LiveGateway:
        self.thread.start()
        # The bound is for a loaded machine, not a pace: it returns once the gateway is ready.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and self.thread.is_alive():
            try:
                if httpx.get(f"{self.url}/readyz").status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.__exit__()  # a gateway that did not start is not left serving
        raise RuntimeError("the gateway did not become ready")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)
