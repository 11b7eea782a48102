"""The server's parts built from its config (the compiled model, KV pool and step costs of
``kvsim serve``, the online simulation, the tokenizer and the text source, the metrics),
and the final outputs written when it stops."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvsim.errors import ConfigError
from kvsim.files import write_output_set
from models.source import resolve_model
from models.tokenizer import Tokenizer
from sim.app.serve.run import (
    SERVE_OUTPUTS,
    ServeResult,
    ServingParts,
    csv_text,
    prepare_serving,
    serving_metrics,
    serving_output_texts,
)
from sim.app.server.config import HttpServeConfig
from sim.app.server.engine import Pacer, ServerEngine
from sim.app.server.metrics import ServerMetrics
from sim.app.server.text import VocabText, server_tokenizer, tokenizer_name
from sim.progress import Phases
from sim.serving.online import OnlineServing
from sim.units import PS_PER_S
from traces.serving_results import (
    HttpServingMetrics,
    ServerFigures,
    ServerWallFigures,
    ServingCompiledFigures,
)


@dataclass
class Service:
    cfg: HttpServeConfig
    parts: ServingParts
    engine: ServerEngine
    metrics: ServerMetrics
    tok: Tokenizer
    text: Any  # VocabText | NpuText
    model_name: str
    max_model_len: int
    created: int = field(default_factory=lambda: int(time.time()))
    wall_start: float = field(default_factory=time.perf_counter)

    @property
    def vocab_size(self) -> int:
        return self.tok.vocab_size

    def text_header(self) -> str:
        return f"{self.text.kind}; tokenizer={tokenizer_name(self.tok)}"

    def pace_header(self) -> str:
        s = self.cfg.server
        return f"real; time-scale={s.time_scale:g}" if s.pace == "real" else "none"


def build_service(cfg: HttpServeConfig, *, progress: Phases | None = None) -> Service:
    """Compile, build the cost models and the text source: everything before listening."""
    if cfg.model.safetensors is not None:
        raise ConfigError("model.safetensors: the server takes a model by preset, GGUF file "
                          "or Hugging Face folder (model.preset)")
    if cfg.serving.speculate is not None:  # its engine steps one token per request
        raise ConfigError("serving.speculate: kvsim serve --http does not decode "
                          "speculatively; leave [serving.speculate] out, or run kvsim serve "
                          "without --http")
    s = cfg.server
    src = resolve_model(cfg.model.preset or cfg.model.hf_config, where="model")
    max_len = cfg.max_model_len(src.config.max_position_embeddings)
    functional = s.fidelity == "functional"
    tok = server_tokenizer(s.tokenizer, src, functional=functional)
    parts = prepare_serving(cfg, max_len, progress=progress)
    if functional:
        from sim.app.server.npu_text import NpuText

        if progress is not None:
            progress.start("compile and launch the functional model")
        text: Any = NpuText(src, cfg.bits.bit_config(cfg.kv), kv=cfg.kv.format,
                            hw=cfg.hardware, tokenizer=tok, max_len=max_len,
                            weights_seed=cfg.model.weights_seed, seed=s.seed)
    else:
        text = VocabText(tok, s.seed)
    serving = cfg.serving
    online = OnlineServing(chips=serving.chips, scheduler=parts.scheduler,
                           geometry=parts.geometry, step_cost=parts.cost.step_ps,
                           plan_cost=(parts.cost.plan_ps if serving.cost.mode == "grid"
                                      else None),
                           swap_cost=parts.swap, router=serving.router)
    name = s.served_model_name or cfg.model.preset or Path(cfg.model.hf_config).stem
    metrics = ServerMetrics(model_name=name, chips=serving.chips,
                            num_blocks=parts.geometry.num_blocks, max_model_len=max_len,
                            info={"pace": s.pace, "time_scale": f"{s.time_scale:g}",
                                  "fidelity": s.fidelity, "hardware": cfg.hardware.name,
                                  "chips": str(serving.chips), "kv": cfg.kv.format,
                                  "tokenizer": tokenizer_name(tok)})
    engine = ServerEngine(online, text, pacer=Pacer(s.pace, s.time_scale), metrics=metrics,
                          tokenizer=tok, lag_tolerance_s=s.lag_tolerance_s)
    return Service(cfg, parts, engine, metrics, tok, text, name, max_len)


def final_result(svc: Service) -> ServeResult:
    """Every request the server took and every step, as ``kvsim serve``'s result, with the
    server's own figures under ``server``."""
    cfg, engine, parts = svc.cfg, svc.engine, svc.parts
    reqs = engine.online.requests
    steps = engine.online.steps()
    serving = serving_metrics(reqs, steps, parts.geometry)
    ends: dict[str, int] = {}
    for lv in engine.lives.values():
        ends[lv.finish or "unfinished"] = ends.get(lv.finish or "unfinished", 0) + 1
    s = cfg.server
    metrics = HttpServingMetrics(
        config=MappingProxyType(cfg.resolved()),
        scenario=(f"kvsim serve --http: {len(reqs)} requests of its clients, "
                  f"{svc.model_name} {cfg.bits.label} kv={cfg.kv.format} on "
                  f"{cfg.serving.chips} x {cfg.hardware.name}, pace {svc.pace_header()}"),
        serving=serving,
        server=ServerFigures(
            pace=s.pace, time_scale=s.time_scale, fidelity=s.fidelity,
            text=svc.text.describe(), tokenizer=tokenizer_name(svc.tok),
            max_model_len=svc.max_model_len, finish_reasons=MappingProxyType(ends),
            lag_max_s=engine.lag_max_s if s.pace == "real" else None,
            late_steps=engine.late_steps if s.pace == "real" else None,
            lag_tolerance_s=s.lag_tolerance_s, failed=engine.failed),
        cost_model=MappingProxyType(parts.cost.describe()),
        compiled=ServingCompiledFigures(m_tile_tokens=parts.cm.m_tile,
                                        cache_tokens=parts.cm.cap,
                                        weight_bytes=parts.cm.mm.bytes_of_kind("weights"),
                                        max_step_tokens=parts.cm.max_seq),
        wall_s=ServerWallFigures(total=time.perf_counter() - svc.wall_start,
                                 compile=parts.compile_s, cost_model=parts.cost_s),
    )
    return ServeResult(cfg, metrics, reqs, steps, parts.geometry, parts.cost)


def http_rows(svc: Service) -> list[dict[str, Any]]:
    """One row per HTTP request: the client's id (its X-Request-ID) beside the simulated
    figures, to join with a benchmark client's own records (times in simulated seconds;
    ``itl_s``: (last token - first token) / (tokens - 1), as benchmark clients count it;
    ``lag_*_s``: under ``--pace real``, how late (wall seconds) its tokens left: the
    largest, the first's, the last's; ``*_unix_s``: the machine's clock (``time.time()``)
    when the HTTP request arrived and when its first token went to the response, which a
    client on the same machine can set beside its own send and receive times)."""
    rows = []
    for lv in svc.engine.lives.values():
        r, s = lv.req, PS_PER_S
        ts = r.token_ps
        rows.append({
            "rid": lv.rid, "client_request_id": lv.client_id or "", "endpoint": lv.endpoint,
            "stream": lv.stream_mode, "finish_reason": lv.finish or "",
            "prompt_tokens": r.prompt_tokens, "completion_tokens": len(lv.tokens),
            "arrival_s": r.arrival_ps / s, "first_token_s": ts[0] / s if ts else None,
            "ttft_s": (ts[0] - r.arrival_ps) / s if ts else None,
            "itl_s": (ts[-1] - ts[0]) / s / (len(ts) - 1) if len(ts) > 1 else None,
            "lag_max_s": lv.lag_max_s, "lag_first_s": lv.lag_first_s,
            "lag_last_s": lv.lag_last_s, "received_unix_s": lv.received_unix,
            "first_token_unix_s": lv.first_unix})
    return rows


def write_outputs(svc: Service, out: str | Path) -> dict[str, Path]:
    """``kvsim serve``'s outputs of every request served and ``http_requests.csv``
    (:func:`http_rows`), as one set, whole or not at all
    (:func:`kvsim.files.write_output_set`; ``metrics.json`` last); a failure is a
    :class:`kvsim.errors.OutputError` naming ``--out``, the file and the folder."""
    texts = {"http_requests.csv": csv_text(http_rows(svc)),
             **serving_output_texts(final_result(svc))}
    written = write_output_set(out, texts, flag="--out", members=SERVE_OUTPUTS)
    return {name.split(".")[0]: p for name, p in written.items()}
