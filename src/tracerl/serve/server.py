"""Run the API with uvicorn: in the foreground (`tracerl serve`) or in a thread (tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from tracerl.models.local import LocalPolicy
from tracerl.serve.app import create_app
from tracerl.serve.engine import Engine


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """`with ServerThread(policy) as server: OpenAI(base_url=server.base_url, …)` — always shut down."""

    def __init__(self, policy: LocalPolicy, *, host: str = "127.0.0.1", port: int | None = None,
                 max_batch_size: int = 16, max_queue: int = 256, **app_kwargs: Any):
        self.host = host
        self.port = port or free_port(host)
        self.engine = Engine(policy, max_batch_size=max_batch_size, max_queue=max_queue)
        self.app = create_app(self.engine, **app_kwargs)
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="tracerl-serve", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.time() > deadline:
                self.close()
                raise RuntimeError(f"the server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.engine.close()


def serve_forever(policy: LocalPolicy, *, host: str, port: int, max_batch_size: int, max_queue: int, **app_kwargs: Any) -> None:
    engine = Engine(policy, max_batch_size=max_batch_size, max_queue=max_queue)
    app = create_app(engine, **app_kwargs)
    try:
        uvicorn.run(app, host=host, port=port, log_level="info", lifespan="off")
    finally:
        engine.close()
