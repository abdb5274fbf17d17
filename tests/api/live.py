"""A real HTTP server for tests that need one: uvicorn in a background thread on a free port.

Generated clients and schemathesis talk to Berth over a socket, as a deployment would; the
server runs the same app as ``berth serve`` (without the in-process reconciler) against the
session's test database.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from app.main import create_app
from tests.api.conftest import settings_for_tests


@contextmanager
def live_server(database_url: str, **settings: Any) -> Iterator[str]:
    """Serve Berth on 127.0.0.1 in a background thread; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(settings_for_tests(database_url, **settings))
    config = uvicorn.Config(app, log_level="warning", loop="asyncio", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
