"""kvsim's ``qbruntime`` (the mobilint-qb-runtime 1.5.0 surface, sim.runtime.vendor) on the
tiny model: its calls give what kvsim's own runtime gives for the same work, logits and
simulated time alike; the virtual clock reads exactly the simulated time; what is not
simulated is refused by name."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kvsim.errors import KvsimError
from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.source import load_preset
from sim.runtime import Accelerator as KvsimAccelerator
from sim.runtime import Model as KvsimModel
from sim.runtime import RuntimeApiError
from sim.runtime.vendor import api as qb
from sim.runtime.vendor import calltrace
from sim.runtime.vendor.system import Settings, reset_system

TINY = load_preset("tiny")
PROMPT = [5, 17, 3, 99, 42, 7, 61, 8, 23, 11]


def _compile(core_mode: str, slots: int = 1):
    from sim.device.hw import load_hardware

    return compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(
        load_hardware("aries")), kv="int8", core_mode=core_mode, max_seq=8, cap=64,
        slots=slots)


@pytest.fixture(scope="module")
def kvm(tmp_path_factory):
    cm = _compile("single", slots=2)
    path = tmp_path_factory.mktemp("qb") / "tiny.kvm"
    cm.save(path)
    return str(path), cm.weight_source().tensor("embed").astype(np.float32)


@pytest.fixture
def sys_():
    s = reset_system(Settings(clock="sim"))
    calltrace.reset()
    yield s
    s.close()


def _launched(path, mc=None):
    model = qb.Model(path, mc)
    model.launch(qb.Accelerator("aries-rb", 0))
    return model


def test_infer_gives_kvsims_logits_and_time_and_the_clock_reads_it(kvm, sys_):
    path, table = kvm
    ref_acc = KvsimAccelerator(hw="aries")
    ref = KvsimModel(path)
    ref.launch(ref_acc)
    want = [ref.infer(table[PROMPT[:8]], cache_size=0)[0],
            ref.infer(table[PROMPT[8:]], cache_size=8)[0]]
    model = _launched(path)
    got = [model.infer([table[PROMPT[:8]][None, None]], None, 0)[0],
           model.infer(table[PROMPT[8:]][None], None, 8)[0]]  # 3-D: no batch axis
    assert got[0].shape == (1, 1, 1, TINY.vocab_size) and got[1].shape == (1, 1, TINY.vocab_size)
    assert np.array_equal(got[0][0, 0, 0], want[0]) and np.array_equal(got[1][0, 0], want[1])
    assert sys_.cards[0].acc.device.env.now == ref_acc.device.env.now
    # the virtual clock moved by exactly the simulated time of the launch and both calls
    assert sys_.clock.now_ps() == ref_acc.device.env.now


def test_chw_inputs_and_both_output_forms(kvm, sys_):
    path, table = kvm
    model = _launched(path)
    x = table[PROMPT[:4]]
    [hwc] = model.infer_hwc([x[None]], None, 0)
    [chw] = model.infer_chw([x.T[:, None, :]], None, 0)  # (hidden, 1, seq)
    assert chw.shape == (TINY.vocab_size, 1, 1) and np.array_equal(chw[:, 0, 0], hwc[0, 0])
    filled: list = []
    assert model.infer([x[None]], filled, 0) is None and np.array_equal(filled[0], hwc)
    mine = [np.zeros((1, 1, TINY.vocab_size), np.float32)]
    assert model.infer([x[None]], mine, 0) is None and np.array_equal(mine[0], hwc)
    before = sys_.cards[0].acc.device.env.now
    with pytest.raises(ValueError, match="Output shape mismatch"):
        model.infer([x[None]], [np.zeros((1, 2, TINY.vocab_size), np.float32)], 0)
    with pytest.raises(ValueError, match="Input shape is invalid"):
        model.infer([x], None, 0)  # 2-D: not the vendor's form
    assert sys_.cards[0].acc.device.env.now == before  # refused calls cost nothing


def test_a_batch_of_requests_on_the_cache_slots(kvm, sys_):
    path, table = kvm
    model = _launched(path)
    infos = model.get_cache_infos()
    assert {i.num_batches for i in infos} == {2} and {i.cache_type for i in infos} == {
        qb.CacheType.Batch}
    x = np.concatenate([table[PROMPT[:3]], table[PROMPT[3:8]]])[None, None]
    [out] = model.infer([x], None, 0, [qb.BatchParam(3, 0, 0), qb.BatchParam(5, 0, 1)])
    alone = _launched_alone(path, table)
    assert out.shape == (1, 1, 2, TINY.vocab_size)
    assert np.array_equal(out[0, 0], alone)


def _launched_alone(path, table):
    rows = []
    for ids in (PROMPT[:3], PROMPT[3:8]):
        acc = KvsimAccelerator(hw="aries")
        m = KvsimModel(path)
        m.launch(acc)
        rows.append(m.infer(table[ids], cache_size=0)[0])
    return np.stack(rows)


def test_one_cache_by_name_and_by_layer_hash(kvm, sys_):
    path, table = kvm
    model = _launched(path)
    model.infer([table[PROMPT[:6]][None, None]], None, 0)
    whole = model.dump_cache_memory(0)
    infos = model.get_cache_infos()
    assert model.dump_cache_memory_by_name(infos[1].name, 0) == whole[1]
    assert model.dump_cache_memory_by_layer_hash(infos[2].layer_hash) == whole[2]
    model.load_cache_memory_by_name(bytes(infos[0].size), infos[0].name, 1)
    assert model.dump_cache_memory(1)[0] == bytes(infos[0].size)
    with pytest.raises(qb.QbRuntimeError, match="no KV cache has name 'l9.k'"):
        model.dump_cache_memory_by_name("l9.k")
    # no sliding-window layer: no fixed-tail cache to clear; the call costs its overhead
    acc = sys_.cards[0].acc
    t0 = acc.device.env.now
    model.reset_fixed_tail_cache_memory(0)
    assert model.dump_cache_memory(0) == whole
    assert acc.calls[-2].op == "reset_fixed_tail_cache_memory"
    assert acc.calls[-2].end_ps - t0 == round(acc.hw.host.call_overhead_ns * 1000)


def test_core_modes_follow_the_compiled_model(kvm, sys_):
    path, _ = kvm
    mc = qb.ModelConfig()
    assert mc.get_core_mode() is qb.CoreMode.Auto and mc.get_num_cores() == 8
    assert _launched(path, mc).get_core_mode() is qb.CoreMode.Single
    mc.set_global8_core_mode()
    with pytest.raises(qb.QbRuntimeError, match="compiled for Single"):
        qb.Model(path, mc)
    cores = [qb.CoreId(qb.Cluster.Cluster1, qb.Core.Core2),
             qb.CoreId(qb.Cluster.Cluster0, qb.Core.Core3)]
    assert mc.set_single_core_mode(cores) and mc.get_num_cores() == 2
    assert mc.get_core_allocation_policy() is qb.CoreAllocationPolicy.Manual
    m = qb.Model(path, mc)
    assert m.get_target_cores() == cores and m.is_target(cores[0])
    assert not mc.set_single_core_mode([qb.CoreId(qb.Cluster.Cluster0, qb.Core.GlobalCore)])
    assert mc.get_core_ids() == cores  # a refused setter changes nothing
    assert not mc.force_single_npu_bundle(-2) and mc.force_single_npu_bundle(1)
    with pytest.raises(qb.QbRuntimeError, match="one NPU bundle"):
        qb.Model(path, mc)


def test_what_is_not_simulated_raises_a_named_error(kvm, sys_):
    path, table = kvm
    model = _launched(path)
    x = [table[PROMPT[:2]][None, None]]
    calls = [lambda: model.infer_to_float(x), lambda: model.infer_buffer([], []),
             lambda: model.acquire_input_buffer(), lambda: model.acquire_input_npu_data([1]),
             lambda: model.infer_npu_data([]), lambda: model.infer_pinned_memory([]),
             lambda: model.reposition_inputs(x, []),
             lambda: model.get_model_variant_handle(0).acquire_output_buffer()]
    for call in calls:
        with pytest.raises(qb.NotSimulatedError, match="is not simulated by kvsim: ") as e:
            call()
        assert isinstance(e.value, KvsimError) and isinstance(e.value, qb.QbRuntimeError)
    # refused by the vendor's runtime itself (an LLM), so refused here as a runtime error
    with pytest.raises(qb.QbRuntimeError, match="LLM models are not supported"):
        model.infer_async(x)
    with pytest.raises(qb.NotSimulatedError, match="several models on one card"):
        qb.Model(path).launch(qb.Accelerator())
    rec = calltrace.calls()
    assert rec["Model.infer_to_float"]["not_simulated"] == 1
    assert rec["Model.infer_async"]["errors"] == 1


def test_the_call_record_keeps_the_programs_calls_not_kvsims_own(kvm, sys_):
    path, table = kvm
    model = _launched(path)
    model.infer([table[PROMPT[:5]][None, None]], None, 0)
    model.infer([table[PROMPT[:1]][None, None]], None, 5)
    rec = calltrace.calls()
    assert rec["Model.infer"]["count"] == 2
    assert rec["Model.infer"]["notes"] == ["5 tokens at cache_size 0", "1 token at cache_size > 0"]
    # Model.__init__ asks for its shapes and builds CoreIds: kvsim's calls, not the program's
    assert "Model.get_model_input_shape" not in rec and "CoreId.__init__" not in rec
    assert rec["Accelerator.__init__"]["notes"] == ["'aries-rb', 0"]


def test_calls_from_another_thread_on_another_card_are_refused(kvm):
    path, table = kvm
    s = reset_system(Settings(clock="sim", cards=2))
    try:
        model = _launched(path)
        got: list = []

        def other() -> None:
            try:
                qb.Model(path).launch(qb.Accelerator(1))
            except qb.NotSimulatedError as err:
                got.append(err)

        with s.call(s.cards[0], "a call in flight"):  # a call on card 0 runs
            t = threading.Thread(target=other)
            t.start()
            t.join()
        assert len(got) == 1 and "several threads" in str(got[0])
        model.infer([table[PROMPT[:1]][None, None]], None, 0)  # card 0 goes on
    finally:
        s.close()


def test_devices_and_accelerator_names():
    s = reset_system(Settings(cards=2))
    try:
        assert qb.get_available_devices() == ["aries-rb"]
        assert qb.get_available_device_numbers() == [0, 1]
        assert qb.get_available_device_numbers("regulus") == []
        assert qb.Accelerator("ARIES", 1).get_device_name() == "aries-rb"
        with pytest.raises(qb.QbRuntimeError, match="no 'regulus' device"):
            qb.Accelerator("regulus")
        with pytest.raises(qb.QbRuntimeError, match="unknown device name 'mla100'"):
            qb.Accelerator("mla100")
        with pytest.raises(qb.QbRuntimeError, match="device number 2"):
            qb.Accelerator(2)
    finally:
        s.close()


def test_the_virtual_clock_modes():
    from sim.runtime.vendor.clock import VirtualClock

    c = VirtualClock("sim")
    assert c.now_ps() == 0
    start = c.begin_call()
    c.end_call(start + 1_234_567)
    assert c.now_ps() == 1_234_567
    assert c.perf_counter_ns() - round(c._base * 1e9) == 1234
    with pytest.raises(RuntimeApiError, match="valid modes are sim, sim\\+host, wall"):
        VirtualClock("cpu")


def test_a_second_card_starts_at_the_hosts_time(kvm):
    path, table = kvm
    s = reset_system(Settings(clock="sim", cards=2))
    try:
        first = _launched(path)
        first.infer([table[PROMPT[:4]][None, None]], None, 0)
        t = s.clock.now_ps()
        second = qb.Model(path)
        second.launch(qb.Accelerator(1))
        card1 = s.cards[1].acc
        # card 1 idled until the host got to it, then launched: the clock moved by the launch
        assert card1.calls[-1].start_ps == t
        assert s.clock.now_ps() == t + (card1.calls[-1].end_ps - card1.calls[-1].start_ps)
    finally:
        s.close()


def test_sim_plus_host_adds_the_host_time_between_calls_only(monkeypatch):
    from sim.runtime.vendor import clock

    real = [100.0]
    monkeypatch.setattr(clock, "_REAL_PERF_COUNTER", lambda: real[0])
    c = clock.VirtualClock("sim+host")
    real[0] += 0.002  # 2 ms of host work before the first call
    start = c.begin_call()
    assert start == 2_000_000_000
    real[0] += 5.0  # the simulator's own time during the call is not the card's
    assert c.now_ps() == start
    c.end_call(start + 7_000_000)  # the call took 7 us of simulated time
    real[0] += 0.001
    assert c.now_ps() == 2_000_000_000 + 7_000_000 + 1_000_000_000
