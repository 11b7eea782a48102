"""The server's parts built from its config (the compiled model, KV pool and step costs of
``kvsim serve``, the online simulation, the tokenizer and the text source, the metrics),
and the final outputs written when it stops."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsim.errors import ConfigError
from models.source import resolve_model
from models.tokenizer import Tokenizer
from sim.app.serve.run import ServeResult, ServingParts, prepare_serving, serving_metrics
from sim.app.server.config import HttpServeConfig
from sim.app.server.engine import Pacer, ServerEngine
from sim.app.server.metrics import ServerMetrics
from sim.app.server.text import VocabText, server_tokenizer, tokenizer_name
from sim.progress import Phases
from sim.serving.online import OnlineServing


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
    metrics = {
        "config": cfg.resolved(),
        "scenario": (f"kvsim serve --http: {len(reqs)} requests of its clients, "
                     f"{svc.model_name} {cfg.bits.label} kv={cfg.kv.format} on "
                     f"{cfg.serving.chips} x {cfg.hardware.name}, pace {svc.pace_header()}"),
        "serving": serving,
        "server": {
            "pace": s.pace, "time_scale": s.time_scale, "fidelity": s.fidelity,
            "text": svc.text.describe(), "tokenizer": tokenizer_name(svc.tok),
            "max_model_len": svc.max_model_len, "finish_reasons": ends,
            "lag_max_s": engine.lag_max_s if s.pace == "real" else None,
            "late_steps": engine.late_steps if s.pace == "real" else None,
            "lag_tolerance_s": s.lag_tolerance_s, "failed": engine.failed,
        },
        "cost_model": parts.cost.describe(),
        "compiled": {"m_tile": parts.cm.m_tile, "cache_length": parts.cm.cap,
                     "weight_bytes": parts.cm.mm.bytes_of_kind("weights"),
                     "max_step_tokens": parts.cm.max_seq},
        "wall_s": {"total": time.perf_counter() - svc.wall_start,
                   "compile": parts.compile_s, "cost_model": parts.cost_s},
    }
    return ServeResult(cfg, metrics, reqs, steps, parts.geometry, parts.cost)
