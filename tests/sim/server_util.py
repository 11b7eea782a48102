"""An in-process ``kvsim serve --http`` for tests: the tiny model on the tiny hardware (its
256-token vocabulary is the byte tokenizer's), listening on a free port of the loopback
address, served by uvicorn in a thread."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

SKIP_SERVER = "the server extra is not installed (pip install 'kvsim[server]')"
SKIP_OPENAI = "the openai client is not installed (pip install 'kvsim[test]')"


def need_server() -> None:
    for mod in ("fastapi", "uvicorn", "prometheus_client"):
        pytest.importorskip(mod, reason=SKIP_SERVER)


def grid_cache(factory) -> Path:
    """One step-cost grid cache for every server test of this process (the same tiny
    config has the same grid)."""
    return factory.getbasetemp() / "kvsim-server-grid"


def tiny_tree(cache: Path, **server) -> dict:
    return {
        "hardware": {"preset": "tiny"}, "model": {"preset": "tiny"}, "kv": {"format": "int8"},
        "compile": {"core_mode": "single"},
        "serving": {"max_num_seqs": 8, "max_num_batched_tokens": 64, "block_tokens": 4,
                    "cost": {"cache_dir": str(cache), "jobs": 1}},
        "server": {"pace": "none", "tokenizer": "bytes"} | server,
    }


@contextmanager
def running_server(tree: dict, out: Path | None = None):
    """``(base_url, service)`` of a server running the config ``tree``; on exit it shuts
    down as on SIGTERM (graceful, then the outputs into ``out``)."""
    from sim.app.server.app import create_app, server_for
    from sim.app.server.config import build_http_config
    from sim.app.server.service import build_service, write_outputs

    cfg = build_http_config(tree)
    svc = build_service(cfg)

    def on_stop() -> None:
        if out is not None:
            write_outputs(svc, out)

    server = server_for(svc, create_app(svc, on_stop=on_stop))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", svc
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
