"""A host program written against the vendor runtime's documented call pattern: load a
compiled model, prefill a prompt in chunks with a growing cache_size, decode one token per
call, snapshot the cache to files and restore it. Only the import line differs from the
vendor's (``from qbruntime import Accelerator, Model, ModelConfig``).

    python examples/vendor_pattern.py MODEL.kvm [--hw aries] [--tokens 8]
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

from sim.runtime import Accelerator, Model, ModelConfig


def generate(path: str, hw: str = "aries", prompt_tokens: int = 24, new_tokens: int = 4,
             chunk: int = 8, seed: int = 0) -> list[int]:
    acc = Accelerator(0, hw=hw)
    model = Model(path, ModelConfig(core_mode=None))
    model.launch(acc)
    # the host owns the embedding table and the token ids (FACTS.md: embedding on the host)
    embed = model.compiled.weight_source().tensor("embed")
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, embed.shape[0], size=prompt_tokens)

    cache_size = 0
    logits = None
    for start in range(0, prompt_tokens, chunk):
        piece = embed[prompt[start : start + chunk]][None, None].astype(np.float32)
        outputs: list = []
        model.infer(piece, outputs, cache_size=cache_size)
        logits = outputs[0]
        cache_size += piece.shape[2]

    tokens = []
    with tempfile.TemporaryDirectory() as snap:
        for step in range(new_tokens):
            token = int(np.argmax(logits))
            tokens.append(token)
            if step == 1:  # snapshot and restore mid-generation
                model.dump_cache_memory_to(snap)
                model.load_cache_memory_from(snap)
            outputs = []
            model.infer(embed[[token]][None, None].astype(np.float32), outputs,
                        cache_size=cache_size)
            logits = outputs[0]
            cache_size += 1
    model.dispose()
    return tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--hw", default="aries")
    p.add_argument("--tokens", type=int, default=8)
    a = p.parse_args()
    print(generate(a.model, hw=a.hw, new_tokens=a.tokens))


if __name__ == "__main__":
    main()
