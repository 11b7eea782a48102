"""``sim.runtime.load`` takes a model name as a run config does (a preset, a config.json, a
GGUF file, a Hugging Face folder) and compiles it; a ``.kvm`` file loads as before."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvsim.errors import ConfigError
from models.bits import BitConfig
from models.compiler import HardwareTarget, compile_model
from models.source import load_preset
from sim import runtime
from sim.device.hw import load_hardware

TINY_HW = load_hardware("tiny")


def test_a_preset_name_loads_compiled_for_the_card() -> None:
    model = runtime.load("tiny", hw="tiny", max_seq=16, cap=64)
    cm = model.compiled
    assert (cm.model.name, cm.max_seq, cm.cap, cm.hw.name) == ("tiny", 16, 64, "tiny")
    assert model.acc is not None and model.acc.hw.name == "tiny"
    x = np.random.default_rng(0).normal(size=(5, cm.model.hidden_size)).astype(np.float32)
    [got] = model.infer(x)
    direct = compile_model(load_preset("tiny"), BitConfig(), HardwareTarget.from_hw(TINY_HW),
                           core_mode=cm.core_mode, max_seq=16, cap=64)
    other = runtime.Model(direct)
    other.launch(runtime.Accelerator(hw="tiny"))
    np.testing.assert_array_equal(got, other.infer(x)[0])


def test_a_config_json_loads_with_synthetic_weights(tmp_path) -> None:
    from tests.models.model_files import hf_config_json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf_config_json(load_preset("tiny"))))
    model = runtime.load(path, hw="tiny", max_seq=8, cap=32, functional=False)
    assert model.compiled.weights["kind"] == "synthetic"


def test_an_unknown_name_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="no-such-model"):
        runtime.load("no-such-model", hw="tiny")
