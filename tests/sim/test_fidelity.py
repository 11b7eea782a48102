"""The two-point calibration's pieces: the serving stack between a client and the card,
the fitted parameters with their bounds, and the compiler's decode weight tile."""

from __future__ import annotations

import pytest

from kvsim.errors import ConfigError
from models.bits import build_bit_config
from models.compiler.blocks.registry import blocks_for
from models.compiler.compiled import TILE_STEP, _TileSearch
from sim.app.cli.main import main
from sim.app.config import load_run_config
from sim.app.run import run
from sim.device.hw import load_hardware
from sim.runtime.ready import ready_model

BASE = ["hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "outputs.trace=off", "compile.max_sequence_length=16", "workload.prompt_tokens=20",
        "workload.output_tokens=3"]


def test_the_client_measures_the_card_plus_the_stack_once_per_request_and_per_token():
    card = run(load_run_config(None, BASE)).metrics
    req, tok = 2_500_000.0, 300_000.0  # ns
    served = run(load_run_config(None, [*BASE, f"hardware.stack.request_ns={req}",
                                        f"hardware.stack.token_ns={tok}"])).metrics
    # the card's own figures do not see the stack
    assert served.prefill == card.prefill and served.decode == card.decode
    c = served.client
    assert c.ttft_s == pytest.approx(req / 1e9 + card.prefill.ttft_s + tok / 1e9, rel=1e-12)
    assert c.time_per_token_s == pytest.approx(card.decode.time_per_token_s + tok / 1e9,
                                               rel=1e-12)
    assert c.tokens_per_s == pytest.approx(1 / c.time_per_token_s, rel=1e-12)
    # without a stack, the client sees the card
    assert card.client.ttft_s == card.prefill.ttft_s
    assert card.client.time_per_token_s == card.decode.time_per_token_s


def test_every_fitted_aries_parameter_is_inside_its_bounds_and_has_its_reason():
    hw = load_hardware("aries")
    assert set(hw.fitted) == {"dram.timing.row_run_bytes", "dma.setup_latency_ns",
                              "sram.bytes_per_core", "stack.token_ns", "stack.request_ns"}
    assert hw.fitted_outside() == []
    for name, f in hw.fitted.items():
        assert f.low < f.high and f.unit and f.fitted_to
        assert name in hw.assumptions  # the reasoning, beside the value
    # an override may leave the bounds: shown, not refused
    assert load_hardware("aries", {"stack.token_ns": 5e7}).fitted_outside() == [
        "stack.token_ns"]


@pytest.mark.parametrize("table, needle", [
    ({"cores.nothing": {"low": 0, "high": 1, "unit": "x", "fitted_to": "y"}},
     "fitted: 'cores.nothing' is not a hardware field"),
    ({"host.call_overhead_ns": {"low": 2, "high": 1, "unit": "ns", "fitted_to": "y"}},
     "low (2) must be <= high (1)"),
])
def test_a_bad_fitted_table_is_refused_naming_it(table, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_hardware("tiny", {"fitted": table})


def test_hw_show_prints_the_fitted_parameters_with_their_bounds(capsys):
    assert main(["hw", "show", "aries"]) == 0
    out = capsys.readouterr().out
    assert "fitted parameters" in out and "stack.request_ns" in out and "NO" not in out


def test_the_decode_weight_tile_is_the_largest_that_fits_a_one_token_pass():
    bits = build_bit_config({})
    cm = ready_model("tiny", "tiny", bits=bits, core_mode="single", max_seq=16, cap=64,
                     functional=False).compiled
    cfg = cm.model
    search = _TileSearch(cfg, bits, "int8", cm.hw, "single", max_seq=16, cap=64, slots=1,
                         blocks=blocks_for(cfg))
    big = cm.big_tile_bytes
    assert big > cm.tile_bytes and big % TILE_STEP == 0 and cm.big_tile_tokens >= 1
    assert search.fits(cm.m_tile, big, 1, head=True)
    assert not search.fits(cm.m_tile, big + TILE_STEP, 1, head=True)


def test_the_validation_config_prefills_in_the_model_zoos_chunks():
    from sim.app.calibration import VALIDATION_CONFIG

    cfg = load_run_config(VALIDATION_CONFIG)
    assert cfg.compile.max_sequence_length == 128  # transformers-mblt's default chunk
    assert cfg.bits.numerics == {"preset": "w8"}  # what a real checkpoint runs with


def test_stack_costs_are_not_negative():
    with pytest.raises(ConfigError, match="stack.token_ns"):
        load_hardware("aries", {"stack.token_ns": -1.0})
