"""``kvsim serve --http [CONFIG]``: the simulated card behind an OpenAI-compatible endpoint.

Builds the service (compile, the step cost grid, the text source), listens (uvicorn), and
on SIGINT/SIGTERM stops taking connections, lets the requests in flight finish for up to
``server.shutdown_grace_s`` (then cancels them), and writes ``kvsim serve``'s outputs for
every request it served (``metrics.json`` with a ``server`` section, ``requests.csv``,
``trace.json``, ``report.html``; each file atomically) into ``--out``.
"""

from __future__ import annotations

import argparse
import signal
import socket
import threading

from rich.console import Console

from kvsim.errors import ConfigError, OutputError

#: ``kvsim serve`` flags that set a ``[server]`` field (flag attribute -> field).
FLAGS = {"host": "host", "port": "port", "pace": "pace", "time_scale": "time_scale",
         "fidelity": "fidelity", "tokenizer": "tokenizer",
         "served_model_name": "served_model_name"}


def add_http_arguments(s: argparse.ArgumentParser) -> None:
    """The ``--http`` flags of ``kvsim serve``."""
    g = s.add_argument_group("HTTP server (--http; needs the extra: pip install "
                             "'kvsim[server]')")
    g.add_argument("--http", action="store_true", help="serve an OpenAI-compatible API "
                   "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics) "
                   "on the simulated card instead of a workload")
    g.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    g.add_argument("--port", type=int, help="port (default 8000; 0: any free port)")
    g.add_argument("--pace", choices=["real", "none"], help="real (default): tokens leave at "
                   "their simulated times (x --time-scale); none: as fast as possible, the "
                   "simulated times in each chunk")
    g.add_argument("--time-scale", type=float, help="wall seconds per simulated second "
                   "(pace real; default 1)")
    g.add_argument("--fidelity", choices=["timing", "functional"], help="timing (default): "
                   "output tokens drawn from the tokenizer's vocabulary; functional: the "
                   "NPU's tokens")
    g.add_argument("--tokenizer", help="GGUF file, Hugging Face folder, smollm2-135m or "
                   "bytes (default: the model's own)")
    g.add_argument("--served-model-name", help="the model id clients ask for")


#: Pending connections the listening socket holds (uvicorn's default).
BACKLOG = 2048


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ConfigError(f"server.port: cannot listen on {host}:{port}: {err.strerror}") from None
    sock.listen(BACKLOG)  # connections made from here on wait for the app to start
    sock.set_inheritable(True)
    return sock


class _Stopped(Exception):
    """SIGTERM, raised again by uvicorn after its graceful shutdown."""


def _raise_stopped(signum, frame) -> None:
    raise _Stopped()


def _catch_sigterm():
    if threading.current_thread() is not threading.main_thread():
        return None  # signals are the main thread's (an in-process server in a test)
    return signal.signal(signal.SIGTERM, _raise_stopped)


def cmd_serve_http(args: argparse.Namespace, console: Console) -> int:
    from kvsim.files import check_out_folder
    from sim.app.server.config import load_http_config
    from sim.progress import Phases, progress_enabled

    sets = list(args.set or [])
    for flag, key in FLAGS.items():
        v = getattr(args, flag, None)
        if v is not None:
            sets.append(f"server.{key}={v!r}" if isinstance(v, str) else f"server.{key}={v}")
    cfg = load_http_config(args.config, sets)  # bad arguments are named with or without the extra
    check_out_folder(args.out, "--out")
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise ConfigError(f"kvsim serve --http needs the server extra: pip install "
                          f"'kvsim[server]' ({err.name} is not installed)") from None
    from sim.app.server.app import create_app, server_for
    from sim.app.server.service import build_service, write_outputs
    s = cfg.server
    sock = _listen(s.host, s.port)
    with Phases(enabled=not args.quiet and progress_enabled()) as ph:
        svc = build_service(cfg, progress=ph)
    paths: dict = {}
    unwritten: list[OutputError] = []

    def on_stop() -> None:
        try:
            paths.update(write_outputs(svc, args.out))
        except OutputError as err:  # said after the server's own summary, exit 2
            unwritten.append(err)

    server = server_for(svc, create_app(svc, on_stop=on_stop))
    host, port = sock.getsockname()[:2]
    if not args.quiet:
        console.print(f"[bold]kvsim serve --http[/bold]: {svc.model_name} on "
                      f"{cfg.serving.chips} x {cfg.hardware.name} at "
                      f"http://{host}:{port}/v1 (pace {svc.pace_header()}; "
                      f"{svc.text.describe()}); Ctrl-C stops", highlight=False,
                      soft_wrap=True)
    # uvicorn stops gracefully on SIGINT/SIGTERM, then raises the signal again for the
    # handler that was there before it: here one that ends the run like Ctrl-C does
    previous = _catch_sigterm()
    try:
        server.run(sockets=[sock])
    except (KeyboardInterrupt, _Stopped):
        pass  # stopped by a signal after the graceful shutdown: the outputs are written
    finally:
        sock.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if not args.quiet:
        m = svc.engine
        console.print(f"kvsim serve --http: stopped after {len(m.online.requests)} requests"
                      + (f"; largest lag {m.lag_max_s * 1e3:.1f} ms, {m.late_steps} steps "
                         "late" if s.pace == "real" else ""), highlight=False,
                      soft_wrap=True)
        for name, p in paths.items():
            console.print(f"{name}: {p}", highlight=False, soft_wrap=True)
    if svc.engine.failed is not None:
        raise ConfigError(f"the server stopped: {svc.engine.failed}")
    if unwritten:
        raise unwritten[0]
    return 0
