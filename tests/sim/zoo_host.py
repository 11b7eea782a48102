"""Host programs written the way host code for the vendor runtime is written (the model
zoo's patterns), used by tests/sim/test_vendor_port.py. Apart from the import line below
(``import qbruntime`` on the real card) nothing here knows it runs on a simulator.

The host owns the embedding table (token embedding runs on the host) and passes float32
embeddings of shape (1, 1, seq, hidden); it reads the last token's logits as
``out[0][0, 0, -1, :]`` and tracks the cache size itself.
"""

from __future__ import annotations

import numpy as np

import sim.runtime as qbruntime


class CacheLayer:
    """The zoo's cache object: it counts the tokens it has seen (the runtime does not) and
    snapshots its slot of the cache."""

    def __init__(self, mxq_model, cache_id: int = 0):
        self.mxq_model = mxq_model
        self.cache_id = cache_id
        self._seen_tokens = 0
        self.buffer = []
        self.buffer_seq_length = None

    def get_seq_length(self) -> int:
        return self._seen_tokens

    def get_max_cache_shape(self) -> int:
        return self.mxq_model.get_input_buffer_info()[0].max_cache_size

    def update_seen_tokens(self, n: int) -> None:
        self._seen_tokens += n

    def set_seq_length(self, n: int) -> None:
        self._seen_tokens = n

    def dump_cache_memory(self) -> None:
        self.buffer = self.mxq_model.dump_cache_memory(self.cache_id)
        self.buffer_seq_length = self.get_seq_length()

    def load_cache_memory(self) -> None:
        self.set_seq_length(self.buffer_seq_length)
        if self.get_seq_length() > 0:
            self.mxq_model.load_cache_memory(self.buffer, self.cache_id)


def embed(table: np.ndarray, ids) -> np.ndarray:
    return table[np.asarray(ids)][None, None].astype(np.float32)


def prefill(model, cache: CacheLayer, table: np.ndarray, ids, npu_prefill_chunk_size: int):
    """Chunked prefill: one infer per chunk, cache_size growing; the last chunk's logits."""
    logits = None
    for start in range(0, len(ids), npu_prefill_chunk_size):
        chunk = embed(table, ids[start:start + npu_prefill_chunk_size])
        if cache.get_seq_length() + chunk.shape[2] > cache.get_max_cache_shape():
            raise ValueError("the prompt does not fit the cache")
        out = model.infer([chunk], None, cache.get_seq_length())
        logits = out[0][0, 0, -1, :]
        cache.update_seen_tokens(chunk.shape[2])
    return logits


def decode(model, cache: CacheLayer, table: np.ndarray, logits, steps: int):
    """Greedy decoding, one token per infer, logits into a preallocated output; the tokens
    and the logits after the last."""
    tokens = []
    out = [np.zeros((1, 1, 1, len(logits)), np.float32)]
    for _ in range(steps):
        token = int(np.argmax(logits))
        tokens.append(token)
        model.infer([embed(table, [token])], out, cache.get_seq_length())
        cache.update_seen_tokens(1)
        logits = out[0][0, 0, -1, :].copy()
    return tokens, logits


def generate(path: str, table: np.ndarray, prompt, *, new_tokens: int, chunk: int,
             snapshot_at: int | None = None, trace: str | None = None) -> list[int]:
    """Load, prefill in chunks, decode; with ``snapshot_at`` dump the cache after that many
    new tokens, wipe it, and restore it before going on."""
    if trace:
        qbruntime.start_tracing_events(trace)
    acc = qbruntime.Accelerator(0)
    mc = qbruntime.ModelConfig()
    mc.set_single_core_mode(1)
    model = qbruntime.Model(path, mc)
    model.launch(acc)
    cache = CacheLayer(model)
    logits = prefill(model, cache, table, list(prompt), chunk)
    if snapshot_at is None:
        tokens, _ = decode(model, cache, table, logits, new_tokens)
    else:
        tokens, logits = decode(model, cache, table, logits, snapshot_at)
        cache.dump_cache_memory()
        model.reset_cache_memory()
        cache.set_seq_length(0)
        cache.load_cache_memory()
        more, _ = decode(model, cache, table, logits, new_tokens - snapshot_at)
        tokens += more
    model.dispose()
    if trace:
        qbruntime.stop_tracing_events()
    return tokens


def batch_decode(path: str, table: np.ndarray, prompts, *, steps: int, chunk: int):
    """Batch LLM: prefill each request into its own cache slot, then decode all of them in
    one infer per step with one BatchParam per request."""
    model = qbruntime.load(path)
    caches = [CacheLayer(model, cache_id=i) for i in range(len(prompts))]
    last = []
    for cache, prompt in zip(caches, prompts, strict=True):
        logits = None
        for start in range(0, len(prompt), chunk):
            ids = prompt[start:start + chunk]
            params = [qbruntime.BatchParam(len(ids), cache.get_seq_length(), cache.cache_id)]
            out = model.infer([embed(table, ids)], None, 0, params)
            cache.update_seen_tokens(len(ids))
            logits = out[0][0, 0, -1, :]
        last.append(int(np.argmax(logits)))
    tokens = [[t] for t in last]
    for _ in range(steps):
        params = [qbruntime.BatchParam(1, c.get_seq_length(), c.cache_id) for c in caches]
        out = model.infer([embed(table, [t[-1] for t in tokens])], None, 0, params)
        for i, cache in enumerate(caches):
            cache.update_seen_tokens(1)
            tokens[i].append(int(np.argmax(out[0][0, 0, i, :])))
    model.dispose()
    return tokens


def speculative_step(path: str, table: np.ndarray, prompt, drafts, accepted: int):
    """Run ``drafts`` (a draft model's guesses) in one call after the prompt, keep the first
    ``accepted`` with filter_cache_tail, and return the new cache size and the logits of
    the next token after the kept ones."""
    model = qbruntime.load(path)
    cache = CacheLayer(model)
    prefill(model, cache, table, list(prompt), len(prompt))
    model.infer([embed(table, drafts)], None, cache.get_seq_length())
    cache.update_seen_tokens(len(drafts))
    mask = [i < accepted for i in range(len(drafts))]
    new_size = model.filter_cache_tail(cache.get_seq_length(), len(drafts), mask)
    cache.set_seq_length(new_size)
    out = model.infer([embed(table, [drafts[0]])], None, cache.get_seq_length())
    model.dispose()
    return new_size, out[0][0, 0, -1, :]
