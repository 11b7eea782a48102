"""Weight-bit and bit configs: presets, validation naming the field, role mapping."""

from __future__ import annotations

import pytest

from kvsim.errors import ConfigError
from models.bits import (
    ROUTER_BITS,
    W4V8,
    W8,
    BitConfig,
    WeightBits,
    build_bit_config,
    build_weight_bits,
    weight_bits_preset,
)
from models.source import load_preset


def test_presets() -> None:
    assert set(W8.model_dump().values()) == {8}
    assert W4V8.value == 8 and W4V8.head == 8
    assert {k: v for k, v in W4V8.model_dump().items() if k not in ("value", "head")} == {
        k: 4 for k in ("query", "key", "output", "up", "gate", "down")
    }
    assert weight_bits_preset("w4v8") is W4V8
    with pytest.raises(ConfigError, match="unknown weight-bit preset 'W2'; valid: W8, W4V8"):
        weight_bits_preset("W2")


@pytest.mark.parametrize("field", ["query", "key", "value", "output", "up", "gate", "down", "head"])
def test_three_bits_rejected_naming_the_field(field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^bits\.weights\.{field}: Input should be 4 or 8$"):
        build_weight_bits({field: 3})
    with pytest.raises(ConfigError, match=rf"bits\.weights\.{field}: Input should be 4 or 8"):
        build_bit_config({"weights": {field: 3}})


def test_ffn_shorthand_and_unknown_keys() -> None:
    assert WeightBits(ffn=4) == WeightBits(up=4, gate=4, down=4)
    with pytest.raises(ConfigError, match="give either ffn or up, not both"):
        build_weight_bits({"ffn": 4, "up": 8})
    with pytest.raises(ConfigError, match=r"bits\.weights\.mlp: unknown key"):
        build_weight_bits({"mlp": 4})
    assert WeightBits.uniform(4) == WeightBits(
        query=4, key=4, value=4, output=4, up=4, gate=4, down=4, head=4
    )


def test_bits_for_roles() -> None:
    assert W4V8.bits_for("value") == 8 and W4V8.bits_for("key") == 4
    assert W4V8.bits_for("kv_latent") == 8  # feeds keys and values: the wider of the two
    assert W4V8.bits_for("router") == ROUTER_BITS
    assert W4V8.bits_for("head") == 8
    with pytest.raises(ConfigError, match="role 'norm' are not quantized"):
        W8.bits_for("norm")


def test_bit_config_formats() -> None:
    b = build_bit_config({"weights": "W4V8", "kv_key_format": "kivi4", "kv_rope_format": "bf16"})
    assert b.weights is W4V8
    assert b.kv_formats(load_preset("tiny")) == {"key": "kivi4", "value": "int8"}
    assert b.kv_formats(load_preset("tiny-mla")) == {"content": "int8", "rope": "bf16"}
    assert BitConfig().weights == W8
    with pytest.raises(ConfigError, match=r"bits\.weights: unknown weight-bit preset 'W3'"):
        build_bit_config({"weights": "W3"})
    with pytest.raises(ConfigError, match=r"bits\.kv_value_format: String should match pattern"):
        build_bit_config({"kv_value_format": ""})
