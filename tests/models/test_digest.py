"""The weights' digest a cache dump's identity carries: other weights of the same shape
digest differently, the same bytes elsewhere the same, and a file rewritten in place is
read again."""

from __future__ import annotations

import shutil

from models.digest import file_digest, weights_digest
from models.weights import SyntheticWeights
from tests.models.model_files import TINY_LLAMA, write_gguf


def test_other_weights_of_the_same_shape_digest_differently(tmp_path):
    a = write_gguf(tmp_path / "a.gguf", TINY_LLAMA, SyntheticWeights(TINY_LLAMA, seed=0))
    b = write_gguf(tmp_path / "b.gguf", TINY_LLAMA, SyntheticWeights(TINY_LLAMA, seed=1))
    assert a.stat().st_size == b.stat().st_size
    assert file_digest(a) != file_digest(b)
    copy = tmp_path / "copy" / "a.gguf"
    copy.parent.mkdir()
    shutil.copy(a, copy)
    assert weights_digest({"kind": "gguf", "path": str(copy)}) == weights_digest(
        {"kind": "gguf", "path": str(a)})
    assert weights_digest({"kind": "synthetic", "seed": 0}) != weights_digest(
        {"kind": "synthetic", "seed": 1})


def test_a_file_rewritten_in_place_is_digested_again(tmp_path):
    a = write_gguf(tmp_path / "a.gguf", TINY_LLAMA, SyntheticWeights(TINY_LLAMA, seed=0))
    before = file_digest(a)
    write_gguf(a, TINY_LLAMA, SyntheticWeights(TINY_LLAMA, seed=2))
    assert file_digest(a) != before
