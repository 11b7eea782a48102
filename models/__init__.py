"""kvsim models: LLM architectures, bit configs, weights and the float reference model.

The names below are the public API other layers (the compiler, ``sim``) build on.
"""

from .bits import W4V8, W8, BitConfig, WeightBits, build_bit_config, weight_bits_preset
from .config import ModelConfig, TensorSpec, build_model
from .hf import load_hf_config
from .reference import ReferenceModel
from .source import (
    ModelSource,
    load_model,
    load_preset,
    open_weights,
    preset_names,
    resolve_model,
)
from .weights import (
    QuantizedWeight,
    SafetensorsWeights,
    SyntheticWeights,
    WeightSource,
    quantize_tensor,
    quantize_weight,
)

__all__ = [
    "W4V8",
    "W8",
    "BitConfig",
    "ModelConfig",
    "QuantizedWeight",
    "ModelSource",
    "ReferenceModel",
    "SafetensorsWeights",
    "SyntheticWeights",
    "TensorSpec",
    "WeightBits",
    "WeightSource",
    "build_bit_config",
    "build_model",
    "load_hf_config",
    "load_model",
    "load_preset",
    "open_weights",
    "preset_names",
    "quantize_tensor",
    "quantize_weight",
    "resolve_model",
    "weight_bits_preset",
]
