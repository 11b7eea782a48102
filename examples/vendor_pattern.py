"""A host program written in the vendor runtime's own call shapes: load a compiled model,
prefill a prompt in chunks of ``npu_prefill_chunk_size`` tokens with a growing
cache_size, decode one token per call reading ``out[0][0, 0, -1, :]``, snapshot the
cache to files mid-generation and restore it. Only the import line differs from the
vendor's (``import qbruntime``).

    python examples/vendor_pattern.py MODEL.kvm [--tokens 8] [--trace host.json]
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

import sim.runtime as qbruntime


def generate(path: str, table: np.ndarray | None = None, prompt_tokens: int = 24,
             new_tokens: int = 4, npu_prefill_chunk_size: int = 8, seed: int = 0,
             trace: str | None = None) -> list[int]:
    """Greedy generation. ``table``: the host's embedding table (token embedding runs on
    the host); without it the compiled model's own weights give it."""
    if trace:
        qbruntime.start_tracing_events(trace)
    model = qbruntime.load(path)  # Accelerator(0) + Model + launch
    max_cache_size = model.get_input_buffer_info()[0].max_cache_size
    if table is None:
        table = model.compiled.weight_source().tensor("embed")
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, table.shape[0], size=prompt_tokens)
    if prompt_tokens + new_tokens > max_cache_size:
        raise SystemExit(f"{prompt_tokens} + {new_tokens} tokens exceed the cache "
                         f"({max_cache_size})")

    cache_size = 0
    logits = None
    for start in range(0, prompt_tokens, npu_prefill_chunk_size):
        chunk = table[prompt[start:start + npu_prefill_chunk_size]][None, None]
        out = model.infer([chunk.astype(np.float32)], None, cache_size)
        logits = out[0][0, 0, -1, :]
        cache_size += chunk.shape[2]

    tokens = []
    with tempfile.TemporaryDirectory() as snap:
        for step in range(new_tokens):
            token = int(np.argmax(logits))
            tokens.append(token)
            if step == 1:  # snapshot and restore mid-generation
                model.dump_cache_memory_to(snap)
                model.reset_cache_memory()
                model.load_cache_memory_from(snap)
            out = model.infer([table[[token]][None, None].astype(np.float32)], None,
                              cache_size)
            logits = out[0][0, 0, -1, :]
            cache_size += 1
    model.dispose()
    if trace:
        qbruntime.stop_tracing_events()
    return tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="compiled model (.kvm, from kvsim compile)")
    p.add_argument("--tokens", type=int, default=8, help="tokens to generate")
    p.add_argument("--trace", help="write a Chrome trace of the runtime calls here")
    a = p.parse_args()
    print(generate(a.model, new_tokens=a.tokens, trace=a.trace))


if __name__ == "__main__":
    main()
