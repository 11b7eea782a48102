"""A table of config mistakes: each gives, from ``kvsim run`` and from ``kvsim check``, one
line on stderr that names the field at fault, exit code 2, no traceback and no output
folder."""

from __future__ import annotations

import pytest

from sim.app.cli.main import main

#: A fast valid config (tiny model on the tiny device) that each case breaks.
TINY = """
[hardware]
preset = "tiny"
[model]
preset = "tiny"
[compile]
core_mode = "single"
[workload]
prompt_tokens = 8
output_tokens = 4
"""

# (name, TOML text added to / replacing TINY, --set overrides, text the error must hold)
CASES = [
    ("unknown key", "[kv]\nformt = 'int8'", [], "kv.formt: unknown key"),
    ("unknown section", "[wrkload]\nprompt_tokens = 8", [], "wrkload: unknown key"),
    ("unknown hardware field", "", ["hardware.dram.efficency=0.5"],
     "hardware.dram.efficency: unknown key"),
    ("wrong type", "", ["workload.prompt_tokens=many"],
     "workload.prompt_tokens: Input should be a valid integer"),
    ("negative size", "", ["workload.prompt_tokens=-8"],
     "workload.prompt_tokens: Input should be greater than or equal to 1"),
    ("negative hardware size", "", ["hardware.sram.bytes_per_core=-1"],
     "hardware.sram.bytes_per_core: Input should be greater than"),
    ("bits = 3", "", ["bits.weights.query=3"], "bits.weights.query: Input should be 4 or 8"),
    ("ffn bits = 3", "", ["bits.weights.ffn=3"], "bits.weights.ffn: must be one of 4, 8, got 3"),
    ("ffn and up", "", ["bits.weights.ffn=4", "bits.weights.up=8"],
     "bits.weights.ffn: give either ffn or up, not both"),
    ("boolean bits", "", ["bits.weights.key=true"], "bits.weights.key: Input should be a valid "
     "integer"),
    ("infinite bandwidth", "", ["hardware.dram.data_rate_mtps=inf"],
     "hardware.dram.data_rate_mtps: Input should be a finite number"),
    ("unknown bits preset", "", ["bits.preset=W3"], "bits.preset: unknown weight-bit preset 'W3'"),
    ("unknown model preset", "", ["model.preset=qwen9"], "model.preset: unknown model preset"),
    ("unknown hardware preset", "", ["hardware.preset=nosuch"],
     "hardware.preset: unknown preset 'nosuch'; valid: aries, regulus, tiny"),
    ("missing hf_config file", "", ["model.hf_config=no/such/config.json"],
     "model.hf_config: file 'no/such/config.json' does not exist"),
    ("model preset and hf_config", "[model]\npreset = 'tiny'\nhf_config = 'x.json'", [],
     "model: give exactly one of 'preset' and 'hf_config'"),
    ("unknown KV format", "", ["kv.format=int3"], "kv.format: unknown KV format 'int3'"),
    ("MLA format on a GQA model", "", ["kv.format=quantmla-c4r4"],
     "kv.format: 'quantmla-c4r4' is a format for MLA models"),
    ("two-format layout on an MLA model", "",
     ["model.preset=deepseek-v2-lite", "hardware.preset=aries", "kv.format=kivi-4"],
     "kv.format: 'kivi-4' has different K and V formats"),
    ("core mode beyond the cores", "", ["compile.core_mode=global8"],
     "compile.core_mode: 'global8' needs 8 cores; tiny has 2"),
    ("cache too short", "", ["compile.cache_length=4"],
     "compile.cache_length: 4 tokens cannot hold the 11 tokens"),
    ("beyond the model's positions", "", ["model.preset=qwen2.5-0.5b", "hardware.preset=aries",
                                          "workload.prompt_tokens=40000"],
     "workload.prompt_tokens: prompt_tokens 40000 + output_tokens 4 - 1 = 40003 tokens exceed"),
    ("model larger than DRAM", "", ["model.preset=llama-3.2-1b"],
     "hardware.dram.capacity_bytes: model 'llama-3.2-1b'"),
    ("bad trace level", "", ["outputs.trace=everything"],
     "outputs.trace: Input should be 'off', 'ops' or 'tiles'"),
    ("negative event limit", "", ["outputs.max_trace_events=-1"],
     "outputs.max_trace_events: Input should be greater than or equal to 0"),
    ("cache op past the last token", "[[workload.cache_ops]]\nat_token = 12\nop = 'dump_load'",
     [], "workload.cache_ops[0].at_token: 12 is past the last token: the sequence ends at 11"),
    ("cache op inside the prefill", "[[workload.cache_ops]]\nat_token = 4\nop = 'dump_load'",
     [], "workload.cache_ops[0].at_token: 4 is inside the prefill"),
    ("unknown cache op", "[[workload.cache_ops]]\nat_token = 8\nop = 'shuffle'", [],
     "workload.cache_ops[0].op: Input should be 'evict', 'requantize' or 'dump_load'"),
    ("evict without a policy", "[[workload.cache_ops]]\nat_token = 8\nop = 'evict'", [],
     "workload.cache_ops[0].policy: op 'evict' needs a policy"),
    ("evict keeping everything",
     "[[workload.cache_ops]]\nat_token = 8\nop = 'evict'\npolicy = 'window'\nsinks = 2\n"
     "recent = 6", [], "workload.cache_ops[0].recent: keeping 8 tokens"),
    ("field of another op", "[[workload.cache_ops]]\nat_token = 8\nop = 'dump_load'\n"
     "recent = 4", [], "workload.cache_ops[0].recent: only op = 'evict' takes it"),
    ("cache op on a gemv workload", "[[workload.cache_ops]]\nat_token = 8\nop = 'dump_load'",
     ["workload.kind=gemv"], "workload.cache_ops: only a 'generate' workload has a KV cache"),
    ("indexed --set past the list", "", ["workload.cache_ops[0].at_token=8"],
     "workload.cache_ops[0]: no such entry (workload.cache_ops has 0)"),
    ("--set without a value", "", ["workload.prompt_tokens"], "expected key=value"),
    ("not TOML", "[workload\nprompt_tokens = 8", [], "not valid TOML"),
]


def _config(tmp_path, extra: str):
    p = tmp_path / "bad.toml"
    section = extra.split("\n", 1)[0] if extra.startswith("[") else ""
    text = TINY
    if section.endswith("]") and section in TINY:  # replace that section of TINY
        head, _, rest = TINY.partition(section)
        nxt = rest.find("\n[")
        text = head + (rest[nxt:] if nxt >= 0 else "")
    p.write_text(text + "\n" + extra + "\n")
    return p


@pytest.mark.parametrize("name, extra, sets, needle", CASES, ids=[c[0] for c in CASES])
def test_bad_config_is_one_line_naming_the_field(tmp_path, capsys, name, extra, sets, needle):
    cfg = _config(tmp_path, extra)
    flags = [a for s in sets for a in ("--set", s)]
    out = tmp_path / "out"
    for argv in (["run", str(cfg), "--out", str(out), "-q", *flags],
                 ["check", str(cfg), *flags]):
        assert main(argv) == 2, argv  # an uncaught exception would fail the test itself
        captured = capsys.readouterr()
        err = captured.err.strip()
        assert err.startswith("kvsim: error: "), err
        assert needle in err, err
        assert "\n" not in err and "Traceback" not in err
        assert captured.out == ""
        assert not out.exists()


def test_there_are_at_least_fifteen_mistakes():
    assert len(CASES) >= 15


def test_valid_config_checks_ok_and_writes_nothing(tmp_path, capsys, monkeypatch):
    cfg = _config(tmp_path, "")
    monkeypatch.chdir(tmp_path)
    assert main(["check", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: tiny W8 kv=int8 on tiny (single): prefill 8 + decode 4 tokens")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]


def test_cache_ops_schema_accepts_each_op(tmp_path, capsys):
    ops = """
[[workload.cache_ops]]
at_token = 8
op = "dump_load"
[[workload.cache_ops]]
at_token = 9
op = "evict"
where = "device"
policy = "window"
sinks = 2
recent = 4
[[workload.cache_ops]]
at_token = 10
op = "evict"
policy = "key_norm"
sinks = 1
recent = 2
budget = 1
[[workload.cache_ops]]
at_token = 11
op = "requantize"
where = "device"
format = "kivi-2.k"
"""
    cfg = _config(tmp_path, ops)
    assert main(["check", str(cfg)]) == 0
    assert "4 cache ops" in capsys.readouterr().out
    # --set reaches into the list; the second evict then finds nothing left to evict
    assert main(["check", str(cfg), "--set", "workload.cache_ops[2].recent=8"]) == 2
    assert "workload.cache_ops[2].recent: keeping 10 tokens" in capsys.readouterr().err


def test_ffn_overrides_the_presets_up_gate_and_down():
    from sim.app.config import load_run_config

    bits = load_run_config(None, ["bits.preset=W8", "bits.weights.ffn=4"]).bits
    wb = bits.weight_bits()
    assert (wb.up, wb.gate, wb.down) == (4, 4, 4)
    assert (wb.query, wb.key, wb.value, wb.output, wb.head) == (8, 8, 8, 8, 8)
    assert bits.label == "W8+ffn=4"
    wb = load_run_config(None, ["bits.preset=W4V8", "bits.weights.ffn=8"]).bits.weight_bits()
    assert (wb.up, wb.gate, wb.down, wb.query, wb.value) == (8, 8, 8, 4, 8)


@pytest.mark.parametrize("preset,kv", [("qwen2.5-0.5b", "int8"), ("tiny", "kivi-4"),
                                       ("deepseek-v2-lite", "quantmla-c4r4")])
def test_slots_add_equal_page_aligned_blocks(preset, kv):
    """kvsim check extrapolates DRAM from one and two slots before it builds a map of many
    slots: that is exact only if every slot adds the same bytes."""
    from models.bits import BitConfig
    from models.compiler.compiled import build_memory_map
    from models.source import load_model

    model = load_model(preset)

    def mm(slots):
        return build_memory_map(model, BitConfig(), kv, cap=512, slots=slots, max_seq=128,
                                m_tile=1)

    one, two = mm(1), mm(2)
    for n in (3, 5, 17):
        m = mm(n)
        assert m.total_bytes == one.total_bytes + (n - 1) * (two.total_bytes - one.total_bytes)
        assert m.bytes_of_kind("kv_cache") == n * one.bytes_of_kind("kv_cache")


def test_a_huge_slot_count_is_refused_with_exact_figures(capsys):
    assert main(["check", "--set", "compile.cache_slots=100000"]) == 2
    assert capsys.readouterr().err.strip() == (
        "kvsim: error: hardware.dram.capacity_bytes: model 'qwen2.5-0.5b' with a cache of 256 "
        "tokens x 100000 slot(s) needs 147 GiB of DRAM (weights 475 MiB, KV cache 146 GiB); "
        "aries has 16 GiB")
