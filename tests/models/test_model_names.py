"""Model names as users type them: any case of a preset or of the embedded model's name,
and a Hugging Face Hub id answered with what kvsim does instead of downloading."""

from __future__ import annotations

import pytest

from kvsim.errors import ConfigError
from models.source import load_model, load_preset, resolve_model


@pytest.mark.parametrize("typed, name", [("Qwen2.5-0.5B", "qwen2.5-0.5b"), ("TINY", "tiny"),
                                         ("Tiny-MLA", "tiny-mla")])
def test_preset_names_in_any_case(typed, name):
    assert resolve_model(typed).name == name
    assert load_preset(typed) == load_preset(name)
    assert load_model(typed) == load_model(name)


def test_the_embedded_model_by_its_own_name_in_any_case():
    a = resolve_model("SmolLM2-135M")
    assert a.name == "smollm2-135m" and a.real
    assert resolve_model("SmolLM2-135M-Instruct").config == a.config


@pytest.mark.parametrize("hub_id", ["HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen2.5-0.5B"])
def test_a_hub_id_says_kvsim_is_offline_and_how_to_use_a_folder(hub_id):
    with pytest.raises(ConfigError) as info:
        resolve_model(hub_id)
    msg = str(info.value)
    assert f"model: {hub_id!r} is not a local file or folder" in msg
    assert "Hugging Face Hub id" in msg and "kvsim is offline" in msg
    assert f"huggingface-cli download {hub_id} --local-dir " in msg
    with pytest.raises(ConfigError, match="kvsim is offline"):
        load_model(hub_id)
