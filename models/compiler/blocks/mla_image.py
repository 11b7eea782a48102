"""What launch loads into DRAM for one MLA layer of a functional compile: its matrices in
the device's basis (:mod:`.mla_calib`), its norm gains and the absorption GEMMs'
multipliers."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...config import ModelConfig
from ...weights import WeightSource, quantize_weight
from ..numerics import GemmQ, LayerQ
from .mla_calib import device_matrix
from .mla_shape import MlaDims, absorbed_params_region, mla_params


def mla_layer_image(cfg: ModelConfig, source: WeightSource, layer: int, q: LayerQ,
                    bits_for: Callable[[str], int],
                    ) -> tuple[list[tuple[str, GemmQ, np.ndarray]], list[tuple[str, np.ndarray]]]:
    """``(gemms, raw)`` of layer ``layer``: ``gemms`` the matrices with a weight and a
    parameter region of their own (name, parameters, float values as the device stores
    them); ``raw`` (region name, uint8 bytes) for the rest: ``k_b_proj``'s codes (per head
    transposed) and its unused parameter region, the absorption multipliers (per head:
    bias int32[kv_lora_rank] = 0, then mult int32[kv_lora_rank]) and the norm gains."""
    if q.mla is None:
        raise ValueError(f"layer {layer}: no MLA parameters (a timing-only compile)")
    d = MlaDims.of(cfg)
    p = f"layers.{layer}."
    mq = mla_params(q)
    names = [("q_b_proj", q.q), ("q_a_proj", mq.q_a)] if d.qr else [("q_proj", q.q)]
    names += [("kv_a_proj", q.k), ("v_b_proj", q.v), ("o_proj", q.o)]
    if not cfg.layer_is_moe(layer):  # a MoE layer's matrices: moe_calib.moe_gemms
        names += [("gate_proj", q.gate), ("up_proj", q.up), ("down_proj", q.down)]
    gemms = [(p + nm, gq, device_matrix(cfg, source, p + nm)) for nm, gq in names]
    kb = p + "k_b_proj"
    codes = quantize_weight(device_matrix(cfg, source, kb), bits_for(kb)).data.reshape(-1)
    assert mq.k_b.mult is not None
    params = np.zeros((d.heads, 2, d.kvr), np.int32)
    params[:, 1, :] = mq.k_b.mult.reshape(d.heads, d.kvr)
    # k_b_proj's own parameter region is not read (the absorption has its own): zeros,
    # loaded as a timing-only launch loads every weight region
    unused = np.zeros(2 * d.heads * d.nope, np.int32).view(np.uint8)
    raw = [(f"w.{kb}", codes), (f"p.{kb}", unused),
           (absorbed_params_region(layer), params.reshape(-1).view(np.uint8))]
    norms = [("attn_norm", q.attn_norm), ("kv_a_norm", mq.kv_a_norm), ("mlp_norm", q.mlp_norm)]
    if d.qr:
        norms.append(("q_a_norm", mq.q_a_norm))
    for nm, nq in norms:
        assert nq.gamma is not None
        raw.append((f"p.{p}{nm}", nq.gamma.view(np.uint8)))
    return gemms, raw
