"""``kvsim serve --http`` stops gracefully on SIGTERM and SIGINT: the listening socket
closes, a request in flight finishes, one that cannot finish within the grace period ends
with an error event (its simulated request is cancelled), the outputs of every request are
written and the command exits 0. The command runs in the test's main thread (where
signals are delivered), the signal is sent to this process."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
import time

import pytest

from tests.sim.server_util import grid_cache, need_server

need_server()

CONFIG = """
[hardware]
preset = "tiny"
[model]
preset = "tiny"
[kv]
format = "int8"
[compile]
core_mode = "single"
[serving]
max_num_seqs = 8
max_num_batched_tokens = 64
block_tokens = 4
[serving.cost]
cache_dir = "{cache}"
jobs = 1
[server]
port = 0
pace = "real"
time_scale = 2000.0
tokenizer = "bytes"
shutdown_grace_s = 2.0
"""
#: Tokens of the request that finishes within the grace period (a tiny decode step is
#: ~80 us simulated, ~0.16 s of wall at this time scale: the signal comes after its first)
SHORT = 4


def _stream(port: int, max_tokens: int, got: list[bytes]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(
        {"model": "tiny", "prompt": "Hi", "max_tokens": max_tokens, "stream": True}),
        {"content-type": "application/json"})
    resp = conn.getresponse()
    while line := resp.readline():
        if line.strip():
            got.append(line.strip())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_gracefully_and_writes_the_outputs(tmp_path, tmp_path_factory, capsys,
                                                          sig):
    from sim.app.cli.main import main

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    cfg = tmp_path / "server.toml"
    cfg.write_text(CONFIG.format(cache=grid_cache(tmp_path_factory)))
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got: list[list[bytes]] = []

    def client() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the socket listens before the app starts
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                break
            except OSError:
                time.sleep(0.05)
        got.extend(_requests_then(port, (SHORT, 400), lambda: os.kill(os.getpid(), sig)))

    t = threading.Thread(target=client)
    t.start()
    assert main(["serve", "--http", str(cfg), "--port", str(port), "--out",
                 str(tmp_path / "out")]) == 0
    t.join(timeout=60)
    short, long = got
    chunks = [json.loads(x[6:]) for x in short[:-1]]  # it finished within the grace period
    assert short[-1] == b"data: [DONE]" and len(chunks) == SHORT
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert b"shut down" in long[-1] and b"[DONE]" not in long[-1]  # it could not
    assert "stopped after 2 requests" in capsys.readouterr().out
    out = tmp_path / "out"
    m = json.loads((out / "metrics.json").read_text())
    assert m["server"]["finish_reasons"] == {"length": 1, "cancelled": 1}
    assert m["serving"]["requests"] == m["serving"]["finished_requests"] == 2
    assert {p.name for p in out.iterdir()} == {"metrics.json", "requests.csv", "trace.json",
                                               "report.html", "http_requests.csv"}
    with pytest.raises(OSError):  # the listening socket is closed
        socket.create_connection(("127.0.0.1", port), timeout=5)


def _requests_then(port: int, lengths, stop) -> list[list[bytes]]:
    """Stream requests of ``lengths`` tokens; after each sent its first chunk, ``stop()``;
    the lines each stream received."""
    got: list[list[bytes]] = [[] for _ in lengths]
    threads = [threading.Thread(target=_stream, args=(port, n, g))
               for n, g in zip(lengths, got, strict=True)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not all(got) and time.monotonic() < deadline:
        time.sleep(0.02)
    stop()
    for t in threads:
        t.join(timeout=60)
    return got
