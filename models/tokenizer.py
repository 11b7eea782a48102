"""Tokenizers of real models: from a GGUF vocabulary or a Hugging Face ``tokenizer.json``,
with the model's chat template.

Both are run by the ``tokenizers`` library. A GGUF file of the ``gpt2`` tokenizer model
(byte-level BPE: ``tokenizer.ggml.tokens``, ``tokenizer.ggml.merges``,
``tokenizer.ggml.token_type``) becomes a BPE model with a byte-level pre-tokenizer and
decoder; control tokens (token type 3) and user-defined ones (4) become special tokens, so
``<|im_start|>`` in a chat prompt is one token. The pre-tokenizer follows llama.cpp's
``tokenizer.ggml.pre``: the ``smollm`` family (StarCoder's) splits digits one by one
before the GPT-2 split (llama.cpp ``llama-vocab.cpp``, ``LLAMA_VOCAB_PRE_TYPE_SMOLLM``).

Chat templates are Jinja templates (``tokenizer.chat_template`` in GGUF,
``chat_template`` in ``tokenizer_config.json``), rendered in a Jinja sandbox bounded in
size and time (:mod:`models.chat_template`: a template is input, and may be hostile).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvsim.errors import ConfigError

#: Special tokens that end a turn or a text in the chat formats of common models (ChatML:
#: Qwen, SmolLM; Llama 3; Phi-3; Gemma; GPT-2 style ``<|endoftext|>``): a continuation stops
#: at any of them the vocabulary holds as a special token, besides the model's own EOS.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                      "<end_of_turn>", "</s>")
#: llama.cpp token types (``llama_token_type``) that are special tokens.
_SPECIAL_TOKEN_TYPES = (3, 4)  # CONTROL, USER_DEFINED
#: ``tokenizer.ggml.pre`` values whose pre-tokenizer splits single digits first.
_DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "codeshell")
_PLAIN_PRE = ("default", "gpt2", "gpt-2")


class Tokenizer:
    """Text <-> token ids, the special ids and the chat template of one model."""

    def __init__(self, backend: Any, *, bos_id: int | None, eos_id: int | None,
                 chat_template: str | None, source: str,
                 stop_ids: frozenset[int] | None = None):
        self.backend = backend  # tokenizers.Tokenizer
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.chat_template = chat_template
        self.source = source
        #: the ids a continuation stops at: EOS and the end-of-turn tokens (see
        #: :data:`END_OF_TURN_TOKENS`; GGUF ``eot``/``eom`` ids, HF generation_config)
        self.stop_ids = frozenset(stop_ids or ()) | (
            frozenset() if eos_id is None else frozenset({eos_id}))

    def continuation_text(self, ids: Sequence[int]) -> str:
        """The text of a continuation: its tokens up to the first stop token, which is
        left out (a chat reply reads without a literal ``<|im_end|>``)."""
        ids = list(ids)
        end = next((i for i, t in enumerate(ids) if int(t) in self.stop_ids), len(ids))
        return self.decode(ids[:end])

    @property
    def vocab_size(self) -> int:
        """Tokens in the vocabulary, special tokens included."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS is added: SmolLM2's GGUF says ``add_bos_token``
        false; prepend :attr:`bos_id` yourself where a model wants one)."""
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens kept, so a chat transcript reads back whole)."""
        return str(self.backend.decode([int(i) for i in ids], skip_special_tokens=False))

    def apply_chat_template(self, messages: Sequence[dict[str, str]], *,
                            add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` (``[{"role": ..., "content": ...}]``)."""
        if not self.chat_template:
            raise ConfigError(f"{self.source}: the model has no chat template")
        from jinja2 import TemplateError

        from .chat_template import render_chat_template

        try:  # a bounded sandbox: the template is input (models.chat_template)
            return render_chat_template(self.chat_template, messages,
                                        add_generation_prompt=add_generation_prompt,
                                        bos_token=self._token(self.bos_id),
                                        eos_token=self._token(self.eos_id))
        except TemplateError as err:
            raise ConfigError(f"{self.source}: chat template fails: {err}") from None
        except RecursionError:
            raise ConfigError(f"{self.source}: chat template fails: it recurses too "
                              f"deeply") from None
        except MemoryError:  # a bound not foreseen: still one line naming the file
            raise ConfigError(f"{self.source}: chat template fails: out of memory") from None

    def _token(self, i: int | None) -> str:
        return "" if i is None else str(self.backend.id_to_token(i) or "")


def tokenizer_from_gguf(fields: Any, path: str | Path) -> Tokenizer:
    """The tokenizer of a GGUF file (``fields`` is its ``metadata(key)`` lookup:
    :meth:`models.gguf.GGUFFile.metadata`)."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    kind = fields("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ConfigError(f"{path}: tokenizer.ggml.model {kind!r} is not supported (only "
                          "'gpt2', byte-level BPE)")
    tokens = fields("tokenizer.ggml.tokens")
    merges = fields("tokenizer.ggml.merges") or []  # none: every token is a byte or special
    if not tokens:
        raise ConfigError(f"{path}: lacks tokenizer.ggml.tokens (the vocabulary)")
    types = fields("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ConfigError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries for "
                          f"{len(tokens)} tokens")
    vocab = {str(t): i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ConfigError(f"{path}: tokenizer.ggml.tokens has duplicate tokens")
    pairs = []
    for m in merges:
        a, sep, b = str(m).partition(" ")
        if not sep or a not in vocab or b not in vocab:
            raise ConfigError(f"{path}: tokenizer.ggml.merges entry {m!r} is not two tokens")
        pairs.append((a, b))
    backend = Backend(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    pre = fields("tokenizer.ggml.pre") or "default"
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLIT_PRE:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in _PLAIN_PRE:
        backend.pre_tokenizer = byte_level
    else:
        raise ConfigError(f"{path}: tokenizer.ggml.pre {pre!r} is not supported; supported: "
                          f"{', '.join(_PLAIN_PRE + _DIGIT_SPLIT_PRE)}")
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(str(tokens[i]), special=True, normalized=False)
                                for i, t in enumerate(types) if int(t) in _SPECIAL_TOKEN_TYPES])

    def ident(key: str) -> int | None:
        v = fields(key)
        if v is None:
            return None
        if not 0 <= int(v) < len(tokens):
            raise ConfigError(f"{path}: {key} = {v} is outside the vocabulary")
        return int(v)

    stops = {i for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
             if (i := ident(key)) is not None}
    specials = {str(tokens[i]): i for i, t in enumerate(types)
                if int(t) in _SPECIAL_TOKEN_TYPES}
    stops |= {specials[t] for t in END_OF_TURN_TOKENS if t in specials}
    return Tokenizer(backend, bos_id=ident("tokenizer.ggml.bos_token_id"),
                     eos_id=ident("tokenizer.ggml.eos_token_id"),
                     chat_template=fields("tokenizer.chat_template"), source=str(path),
                     stop_ids=frozenset(stops))


def _token_id(backend: Any, value: Any) -> int | None:
    if isinstance(value, dict):  # {"content": "<|im_end|>", ...}
        value = value.get("content")
    if isinstance(value, str):
        i = backend.token_to_id(value)
        return None if i is None else int(i)
    return None


def tokenizer_from_folder(folder: str | Path) -> Tokenizer:
    """``tokenizer.json`` of a Hugging Face folder, with ``tokenizer_config.json`` (chat
    template, BOS/EOS tokens) when present."""
    from tokenizers import Tokenizer as Backend

    d = Path(folder)
    tj = d / "tokenizer.json"
    if not tj.is_file():
        raise ConfigError(f"{tj}: no tokenizer.json in the model folder")
    try:
        backend = Backend.from_file(str(tj))
    except Exception as err:  # the Rust side raises a bare Exception on bad files
        raise ConfigError(f"{tj}: not a valid tokenizer.json: {err}") from None
    cfg: dict[str, Any] = {}
    tc = d / "tokenizer_config.json"
    if tc.is_file():
        try:
            cfg = json.loads(tc.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"{tc}: not valid JSON: {err}") from None
        if not isinstance(cfg, dict):
            raise ConfigError(f"{tc}: top level must be a JSON object")
    template = cfg.get("chat_template")
    ct = d / "chat_template.jinja"
    if template is None and ct.is_file():
        template = ct.read_text()
    return Tokenizer(backend, bos_id=_token_id(backend, cfg.get("bos_token")),
                     eos_id=_token_id(backend, cfg.get("eos_token")),
                     chat_template=template if isinstance(template, str) else None,
                     source=str(tj), stop_ids=_folder_stops(backend, d))


def _folder_stops(backend: Any, folder: Path) -> frozenset[int]:
    """A HF folder's stop ids: ``generation_config.json``'s ``eos_token_id`` (an id or a
    list) and the end-of-turn tokens its vocabulary holds as special tokens."""
    stops: set[int] = set()
    gc = folder / "generation_config.json"
    if gc.is_file():
        try:
            ids = json.loads(gc.read_text()).get("eos_token_id")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
            raise ConfigError(f"{gc}: not a JSON object: {err}") from None
        for i in ids if isinstance(ids, list) else [ids]:
            if isinstance(i, int) and not isinstance(i, bool) and i >= 0:
                stops.add(i)
    added = {t.content: i for i, t in backend.get_added_tokens_decoder().items()
             if t.special}
    return frozenset(stops | {added[t] for t in END_OF_TURN_TOKENS if t in added})
