"""Text of the server's requests: the tokenizer, the sampling parameters, the output text
as tokens come (incremental detokenization, stop sequences), and the timing mode's tokens.

In timing mode (the default) the tokens of a continuation are drawn from the tokenizer's
ordinary vocabulary (no special token, none that decodes to nothing or to a broken
character), so a load test runs at the simulator's speed; the response says so. Greedy
requests (temperature 0) get the same text for the same prompt, seeded ones the same text
for the same seed; every draw comes from a generator seeded by the server's seed.
The functional mode's tokens (the NPU's) are in :mod:`.npu_text`.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsim.errors import ConfigError
from models.source import EMBEDDED_MODEL, ModelSource, resolve_model
from models.tokenizer import Tokenizer

#: The name of the byte tokenizer (each byte one token, ids 0..255).
BYTES = "bytes"


def _byte_chars() -> list[str]:
    """The printable character GPT-2's byte-level BPE writes for each byte (bytes that
    print as themselves keep their character; the others take the characters from
    U+0100 on, in byte order). The byte-level pre-tokenizer and decoder of ``tokenizers``
    use the same table."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def bytes_tokenizer() -> Tokenizer:
    """Each byte of the UTF-8 text is one token (ids 0..255, no merges, no specials): the
    tokenizer of a model without one whose vocabulary is 256 tokens (the ``tiny`` presets)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {c: b for b, c in enumerate(_byte_chars())}
    backend = Backend(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend, bos_id=None, eos_id=None, chat_template=None, source=BYTES)


def server_tokenizer(spec: str | None, src: ModelSource, *, functional: bool) -> Tokenizer:
    """The tokenizer ``server.tokenizer`` names, or by default the model's own (a real
    checkpoint), else (timing mode) the embedded model's if it is installed, else bytes.
    In functional mode its vocabulary must hold every token the model can produce."""
    if spec is not None:
        tok = bytes_tokenizer() if spec == BYTES else _named(spec)
    elif src.real:
        tok = src.tokenizer()
    elif not functional and _embedded_installed():
        tok = resolve_model(EMBEDDED_MODEL).tokenizer()
    else:
        tok = bytes_tokenizer()
    if functional and tok.vocab_size < src.config.vocab_size:
        raise ConfigError(f"server.tokenizer: {tok.source} has {tok.vocab_size} tokens; the "
                          f"model produces ids up to {src.config.vocab_size - 1} (functional "
                          "mode needs the model's own tokenizer)")
    return tok


def _named(spec: str) -> Tokenizer:
    try:
        return resolve_model(spec, where="server.tokenizer").tokenizer()
    except ConfigError as err:
        raise ConfigError(f"server.tokenizer: {err}") from None


def _embedded_installed() -> bool:
    try:
        resolve_model(EMBEDDED_MODEL)
    except ConfigError:
        return False
    return True


def tokenizer_name(tok: Tokenizer) -> str:
    """A short name of the tokenizer for responses (its file's name, or ``bytes``)."""
    return tok.source.rsplit("/", 1)[-1]


def ordinary_ids(tok: Tokenizer) -> np.ndarray:
    """Token ids a timing-mode continuation draws from: not special, and each decodes on
    its own to printable text (or a newline) without a replacement character."""
    backend = tok.backend
    n = tok.vocab_size
    special = {int(i) for i in backend.get_added_tokens_decoder()}
    texts = backend.decode_batch([[i] for i in range(n)], skip_special_tokens=False)
    keep = [i for i, t in enumerate(texts)
            if i not in special and t and "\ufffd" not in t
            and (t.isprintable() or t == "\n")]
    if not keep:
        raise ConfigError(f"{tok.source}: no ordinary token to draw a continuation from")
    return np.asarray(keep, dtype=np.int64)


@dataclass(frozen=True)
class Sampling:
    """How a request's continuation is made and where it stops."""

    max_tokens: int
    temperature: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0


class VocabText:
    """Timing mode: a continuation of tokens drawn from the ordinary vocabulary."""

    kind = "timing"

    def __init__(self, tok: Tokenizer, seed: int):
        self.tok = tok
        self.seed = seed
        self.ids = ordinary_ids(tok)

    def describe(self) -> str:
        return (f"timing mode: output tokens drawn from the vocabulary of "
                f"{tokenizer_name(self.tok)} ({self.ids.size} ordinary tokens), not a model")

    def open(self, rid: int, prompt: Sequence[int], sampling: Sampling) -> VocabStream:
        if sampling.seed is not None:
            key = [self.seed, 1, sampling.seed % 2**64]
        elif sampling.temperature == 0:  # greedy: the same prompt, the same text
            data = np.asarray(prompt, dtype=np.int64).tobytes()
            key = [self.seed, 2, len(prompt), zlib.crc32(data)]
        else:
            key = [self.seed, 3, rid]
        return VocabStream(self.ids, np.random.default_rng(np.random.SeedSequence(key)))

    def close(self) -> None:
        pass


class VocabStream:
    def __init__(self, ids: np.ndarray, rng: np.random.Generator):
        self.ids, self.rng = ids, rng

    async def next(self) -> int:
        return int(self.ids[self.rng.integers(self.ids.size)])

    def close(self) -> None:
        pass


class Detokenizer:
    """Text of a growing list of tokens, piece by piece: a token whose bytes end inside a
    character shows nothing until the character is whole (each piece is decoded with the
    tokens before it, so byte-level merges across tokens come out right)."""

    #: tokens decoded before the new ones, for context (a character spans at most 4 bytes)
    CONTEXT = 6

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.ids: list[int] = []
        self.prefix = 0  # first token of the context
        self.read = 0  # tokens whose text has been given

    def add(self, token: int) -> str:
        ids = self.ids
        ids.append(token)
        done = self.tok.decode(ids[self.prefix:self.read])
        text = self.tok.decode(ids[self.prefix:])
        if len(text) > len(done) and not text.endswith("\ufffd"):
            self.read = len(ids)
            self.prefix = max(0, self.read - self.CONTEXT)
            return text[len(done):]
        return ""

    def flush(self) -> str:
        """Whatever text is still held (a broken character comes out as U+FFFD)."""
        done = self.tok.decode(self.ids[self.prefix:self.read])
        text = self.tok.decode(self.ids[self.prefix:])
        self.read = len(self.ids)
        return text[len(done):]


class StopText:
    """Output text against stop sequences: text is sent once it cannot be the start of a
    stop sequence; a stop sequence ends the text before it (OpenAI's rule)."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.held = ""

    def push(self, piece: str) -> tuple[str, bool]:
        """``(text that may be sent, whether a stop sequence was found)``."""
        buf = self.held + piece
        hits = [i for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            self.held = ""
            return buf[:min(hits)], True
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


def save_hf_tokenizer(tok: Tokenizer, folder: str | Path) -> Path:
    """Write ``tok`` as a Hugging Face tokenizer folder (``tokenizer.json`` and
    ``tokenizer_config.json`` with its special tokens and chat template), the form
    benchmark clients load (``AutoTokenizer.from_pretrained(folder)``)."""
    import json

    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    tok.backend.save(str(d / "tokenizer.json"))
    b = tok.backend
    cfg: dict[str, object] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if tok.bos_id is not None:
        cfg["bos_token"] = b.id_to_token(tok.bos_id)
    if tok.eos_id is not None:
        cfg["eos_token"] = b.id_to_token(tok.eos_id)
    if tok.chat_template:
        cfg["chat_template"] = tok.chat_template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return d
