"""A cheap digest of a model's weights, for the identity a cache dump must match
(``sim.runtime.cacheops.model_identity``): two models of the same shape whose weights
differ get different digests, without reading gigabytes.

- synthetic weights are named by their seed (the generator makes the same tensors from it);
- weight files (GGUF, safetensors shards) are digested from their size and a sample of
  their bytes: the first and last :data:`BLOCK_BYTES` and :data:`SAMPLES` blocks spread
  evenly between (at most 1 MiB read per file, whatever its size). Other weights of the same
  shape (a fine-tune, another quantization, a retrained checkpoint) differ in nearly every
  block, so a sample tells them apart; the same file copied elsewhere keeps its digest.

A file is read once per size and modification time (a rewritten file is digested again).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any

from kvsim.errors import ConfigError

#: Bytes read per sampled block (an assumption: large enough to span several tensor rows).
BLOCK_BYTES = 64 * 1024
#: Blocks sampled between a file's first and last block.
SAMPLES = 14
#: Hex digits of a digest (64 bits: a chance collision is not a concern for one user's dumps).
DIGEST_HEX = 16


@functools.lru_cache(maxsize=32)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    del mtime_ns  # part of the cache key only
    h = hashlib.blake2b(digest_size=DIGEST_HEX // 2)
    h.update(size.to_bytes(8, "little"))
    last = max(0, size - BLOCK_BYTES)
    offsets = sorted({0, last, *(last * (i + 1) // (SAMPLES + 1) for i in range(SAMPLES))})
    with open(path, "rb") as f:
        for off in offsets:
            f.seek(off)
            h.update(f.read(BLOCK_BYTES))
    return h.hexdigest()


def file_digest(path: str | os.PathLike) -> str:
    """The sampled digest of one weight file (:class:`ConfigError` if it cannot be read)."""
    p = Path(path)
    try:
        st = p.resolve().stat()
        return _file_digest(str(p.resolve()), st.st_size, st.st_mtime_ns)
    except OSError as err:
        raise ConfigError(f"{p}: cannot read the weights to identify them: "
                          f"{err.strerror or err}") from None


def weights_digest(spec: dict[str, Any]) -> str:
    """A short text naming the weights a spec describes (``synthetic:seed=0``,
    ``gguf:1f3a...``, ``safetensors:...``)."""
    kind = spec.get("kind")
    if kind == "synthetic":
        return f"synthetic:seed={spec.get('seed')}"
    files = [spec["path"]] if "path" in spec else list(spec.get("paths", ()))
    if not files:
        return f"{kind}:no files"
    if len(files) == 1:
        return f"{kind}:{file_digest(files[0])}"
    h = hashlib.blake2b(digest_size=DIGEST_HEX // 2)
    for f in files:  # shards in their order
        h.update(file_digest(f).encode())
    return f"{kind}:{h.hexdigest()}"


__all__ = ["BLOCK_BYTES", "SAMPLES", "file_digest", "weights_digest"]
