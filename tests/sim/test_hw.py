import pytest
from pydantic import ValidationError

from kvsim.errors import ConfigError
from sim.device.hw import HardwareConfig, load_hardware, preset_dict, preset_names


def _leaves(tree, prefix=""):
    for k, v in tree.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            yield from _leaves(v, path)
        else:
            yield path


@pytest.mark.parametrize("name", ["aries", "regulus"])
def test_every_number_of_a_real_preset_has_a_source_or_an_assumption(name):
    hw = load_hardware(name)
    data = preset_dict(name)
    skip = {"name", "description", "host_link.kind"}
    for path in _leaves({k: v for k, v in data.items()
                         if k not in ("sources", "assumptions", "fitted")}):
        if path in skip:
            continue
        assert path in hw.sources or path in hw.assumptions, f"{name}: {path} has no note"
    for path in list(hw.sources) + list(hw.assumptions):
        assert path in set(_leaves(data)), f"{name}: note for unknown field {path}"


def test_aries_matches_the_published_figures():
    hw = load_hardware("aries")
    assert hw.cores.num_cores == 8
    assert hw.cores.peak_ops_per_s("w8a8") == pytest.approx(80e12)
    assert hw.dram.peak_bytes_per_s == pytest.approx(66.7e9, rel=1e-3)
    assert hw.dram.capacity_bytes == 17179869184
    assert hw.host_link.kind == "pcie"
    assert (hw.host_link.pcie.generation, hw.host_link.pcie.lanes) == (4, 8)


def test_regulus_has_no_pcie_link():
    hw = load_hardware("regulus")
    assert hw.host_link.kind == "shared_dram" and hw.host_link.pcie is None
    assert hw.cores.peak_ops_per_s("w8a8") == pytest.approx(10e12)
    assert "pcie_raw_bytes_per_s" not in hw.derived


def test_overrides_apply_field_by_field_and_config_is_frozen():
    hw = load_hardware("aries", {"dram.efficiency": 0.5, "cores.clock_hz": 1e9})
    assert hw.dram.efficiency == 0.5 and hw.cores.clock_hz == 1e9
    assert hw.dram.channels == 8
    with pytest.raises(ValidationError, match="frozen"):
        hw.dram.channels = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"dram.chanels": 2}, "hardware.dram.chanels: unknown key"),
        ({"dram.channels": 0}, "hardware.dram.channels"),
        ({"dram.efficiency": 1.5}, "hardware.dram.efficiency"),
        ({"host_link.pcie.generation": 7}, "hardware.host_link.pcie.generation"),
        ({"cores.macs_per_cycle.w3a8": 5}, "w3a8"),
        ({"host_link.kind": "shared_dram"}, "shared_dram"),
        ({"dram.channels.x": 1}, "hardware.dram.channels: is a value, not a table"),
    ],
)
def test_bad_fields_are_named(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_hardware("aries", overrides)


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ConfigError, match="valid: aries, regulus, tiny"):
        load_hardware("mla100")
    assert preset_names() == ["aries", "regulus", "tiny"]
    assert isinstance(load_hardware("tiny"), HardwareConfig)


def test_hw_show_prints_the_protocol_efficiency_per_pattern_and_that_the_engine_uses_it(
        capsys):
    import json

    from sim.app.cli.main import main

    assert main(["hw", "show", "aries"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for name in ("weight_stream", "kv_token_read", "kv_token_append", "activation_store",
                 "mixed_rw", "tRFCab", "[head][token][dim]"):
        assert name in out
    assert "the engine times every DMA chunk with this model" in out
    assert main(["hw", "show", "aries", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    eff = data["dram_protocol"]["sustained_efficiency"]
    assert sorted(eff) == sorted(["weight_stream", "kv_token_read", "kv_token_append",
                                  "activation_store", "mixed_rw"])
    # refresh (1 - 882 / 8133 = 0.8916) times the reopens of each row (of 512 cycles of
    # data) that other masters force: 84 cycles each (tRTP - BL/2 + tRPpb + tRCD)
    from sim.device.dram.patterns import reopens_per_page
    from sim.device.dram.timing import timing_from_config

    r = reopens_per_page(timing_from_config(load_hardware("aries").dram))
    assert eff["weight_stream"] == pytest.approx((1 - 882 / 8133) * 512 / (512 + 84 * r),
                                                 abs=882 / 262144 + 84 / 262144)
    assert data["dram_protocol"]["timing_cycles"]["tRFCab"] == 792
    assert "dram.efficiency" in data["dram_protocol"]["note"]
    assert main(["hw", "show", "tiny", "--json"]) == 0
    assert "dram_protocol" not in json.loads(capsys.readouterr().out)


def test_hw_show_protocol_follows_a_set_timing_field(capsys):
    import json

    from sim.app.cli.main import main

    assert main(["hw", "show", "aries", "--json", "--set", "dram.timing.trfc_ab_ns=280"]) == 0
    data = json.loads(capsys.readouterr().out)["dram_protocol"]
    assert data["timing_cycles"]["tRFCab"] == 584  # ceil(280 / 0.47996)
    assert data["refresh_loss"] == 584 / 8133
