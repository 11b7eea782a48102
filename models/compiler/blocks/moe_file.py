"""A MoE layer's integer parameters (:class:`..numerics.MoeQ`) in a ``.kvm`` file: the
scalars in the header, each GEMM's multiplier and bias arrays under ``<layer>.moe.<name>``
(experts: ``<layer>.moe.e<id>.gate|up|down``), and their checks on load."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from ...config import ModelConfig
from ..numerics import AddQ, GemmQ, MoeQ, SiluQ

_EXPERT = ("gate", "up", "down")


def moe_to_header(layer: int, mq: MoeQ, gemm: Callable[[str, GemmQ], dict]) -> dict:
    """The header entry of ``mq`` (``gemm(key, g)`` stores ``g``'s arrays, returns its
    scalars)."""
    out: dict[str, Any] = {}
    for f in fields(MoeQ):
        v = getattr(mq, f.name)
        if isinstance(v, GemmQ):
            out[f.name] = gemm(f"{layer}.moe.{f.name}", v)
        elif isinstance(v, AddQ | SiluQ):
            out[f.name] = dict(vars(v))
        elif f.name == "experts":
            out[f.name] = [{nm: gemm(f"{layer}.moe.e{e}.{nm}", g)
                            for nm, g in zip(_EXPERT, trio, strict=True)}
                           for e, trio in enumerate(v)]
        else:
            out[f.name] = v
    return out


def moe_from_header(layer: int, d: dict, gemm: Callable[[str, dict], GemmQ]) -> MoeQ:
    """:class:`MoeQ` from its header entry (``gemm(key, scalars)`` reads a GEMM)."""
    kw: dict[str, Any] = {}
    for f in fields(MoeQ):
        v = d[f.name]
        if f.name == "experts":
            kw[f.name] = [tuple(gemm(f"{layer}.moe.e{e}.{nm}", x[nm]) for nm in _EXPERT)
                          for e, x in enumerate(v)]
        elif f.name in ("add_first", "add_next"):
            kw[f.name] = AddQ(**v)
        elif f.name in ("silu", "shared_silu"):
            kw[f.name] = SiluQ(**v)
        elif isinstance(v, dict):
            kw[f.name] = gemm(f"{layer}.moe.{f.name}", v)
        else:
            kw[f.name] = v
    return MoeQ(**kw)


def moe_scalars(mq: MoeQ) -> list[tuple[str, object]]:
    """``(where, object)`` of every record of ``mq`` whose scalars must be int32."""
    out: list[tuple[str, object]] = [(f.name, getattr(mq, f.name)) for f in fields(MoeQ)
                                     if f.name != "experts"
                                     and not isinstance(getattr(mq, f.name), int)]
    out += [(f"experts[{e}].{nm}", g) for e, trio in enumerate(mq.experts)
            for nm, g in zip(_EXPERT, trio, strict=True)]
    return out


def moe_ints(mq: MoeQ) -> dict[str, int]:
    """The plain integer fields of ``mq``."""
    return {f.name: getattr(mq, f.name) for f in fields(MoeQ)
            if isinstance(getattr(mq, f.name), int)}


def moe_vectors(cfg: ModelConfig, layer: int, mq: MoeQ) -> list[tuple[str, int]]:
    """``(array key, rows)`` of the multipliers a functional MoE layer must carry."""
    assert cfg.n_routed_experts is not None and cfg.moe_intermediate_size is not None
    if len(mq.experts) != cfg.n_routed_experts:
        raise ValueError(f"layers[{layer}].moe.experts has {len(mq.experts)} entries; the "
                         f"model has {cfg.n_routed_experts} routed experts")
    inter, h = cfg.moe_intermediate_size, cfg.hidden_size
    out = [(f"{layer}.moe.router.mult", cfg.n_routed_experts)]
    for e in range(cfg.n_routed_experts):
        out += [(f"{layer}.moe.e{e}.gate.mult", inter), (f"{layer}.moe.e{e}.up.mult", inter),
                (f"{layer}.moe.e{e}.down.mult", h)]
    ws = cfg.shared_expert_width
    if ws:
        out += [(f"{layer}.moe.shared_gate.mult", ws), (f"{layer}.moe.shared_up.mult", ws),
                (f"{layer}.moe.shared_down.mult", h)]
    if cfg.shared_expert_gate:
        out.append((f"{layer}.moe.shared_logit.mult", 1))
    return out

