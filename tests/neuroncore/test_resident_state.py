"""Resident state (neuroncore/runtime/state.py): tensors a core keeps in HBM between executions,
read by bound parameters and written back in place by bound outputs, never crossing to the host."""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.dtypes import DType
from neuroncore.runtime import StateBinding, StateError


@pytest.fixture(scope="module")
def accumulate():
    """acc' = acc + x (a [4, 8] corner of the resident tensor), and y = 2 * x for the host."""
    b = nc.GraphBuilder("accumulate")
    x = b.parameter("x", (4, 8), "fp32")
    acc = b.parameter("acc", (4, 8), "fp32")
    return nc.compile(b.build([b.multiply(x, 2.0), b.add(acc, x)]), "trn1")


def test_bound_tensors_stay_on_the_core_and_update_in_place(accumulate):
    core = nc.Instance("trn1.2xlarge").core(0)
    model = core.load(accumulate)
    tensor = core.allocate_state("acc", (6, 8), DType.FP32)  # larger: the program uses a corner
    assert core.hbm_used_bytes == sum(accumulate.hbm_bytes_by_kind().values()) + 6 * 8 * 4
    binding = StateBinding(reads={1: "acc"}, writes={1: "acc"})
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    first = model.execute([x, None], state=binding)
    held = tensor.values
    second = model.execute([x, None], state=binding)
    assert tensor.values is held  # written where it is, not replaced
    np.testing.assert_array_equal(tensor.values[:4], 2 * x)
    assert not tensor.values[4:].any()  # outside the program's corner: untouched
    assert len(second.outputs) == 1  # only the host's output comes back
    np.testing.assert_array_equal(second.outputs[0], 2 * x)
    for result in (first, second):  # x in, y out: the resident tensor crosses neither way
        assert result.host_to_device_bytes == 4 * 8 * 4 and result.device_to_host_bytes == 4 * 8 * 4
    plain = model.execute([x, x])
    assert plain.host_to_device_bytes == 2 * 4 * 8 * 4 and plain.device_to_host_bytes == 2 * 4 * 8 * 4
    timing = model.execute([x, None], state=binding, timing_only=True)
    assert timing.outputs is None and timing.device_time_ns == second.device_time_ns
    np.testing.assert_array_equal(tensor.values[:4], 2 * x)  # timing-only runs compute nothing


def test_binding_mistakes_are_one_line(accumulate):
    core = nc.Instance("trn1.2xlarge").core(0)
    model = core.load(accumulate)
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(StateError, match="no resident tensor 'acc'"):
        model.execute([x, None], state=StateBinding(reads={1: "acc"}))
    core.allocate_state("small", (2, 8), DType.FP32)
    with pytest.raises(StateError, match=r"has no leading corner of shape \[4, 8\]"):
        model.execute([x, None], state=StateBinding(reads={1: "small"}))
    core.allocate_state("acc", (4, 8), DType.FP32)
    with pytest.raises(StateError, match="pass None for it"):
        model.execute([x, x], state=StateBinding(reads={1: "acc"}))
    with pytest.raises(StateError, match="input 1 is None"):
        model.execute([x, None])
    with pytest.raises(ValueError, match="exists on core 0 as"):
        core.allocate_state("acc", (4, 9), DType.FP32)
    with pytest.raises(ValueError, match="does not fit in device memory"):
        core.allocate_state("huge", (1 << 20, 1 << 14), DType.FP32)
    core.free_state("acc")
    assert "acc" not in core.resident


def test_a_training_device_state_is_held_in_the_cores_one_store():
    """A training step's DeviceState keeps its tensors in the core's resident store (the KV caches'
    store): they count in the core's HBM, two states of the same names coexist on one core, and a
    state's tensors are released with it."""
    import gc

    from neuroncore.runtime.device import DeviceState

    core = nc.Instance("trn1.2xlarge").core(0)
    weights = {"param/w": np.ones((4, 8), np.float32), "grad/w": np.zeros((4, 8), np.float32)}
    whole = DeviceState(core, weights)
    assert core.hbm_used_bytes == whole.nbytes == 2 * 4 * 8 * 4
    block = DeviceState(core, {"param/w": np.full((2, 8), 3.0, np.float32)})  # a rank's block
    assert core.hbm_used_bytes == whole.nbytes + block.nbytes
    whole.update({"param/w": np.full((4, 8), 2.0, np.float32)})
    np.testing.assert_array_equal(whole.inputs(["param/w", "x"], {"x": np.zeros(1)})[0], 2.0)
    np.testing.assert_array_equal(block.tensors["param/w"], 3.0)
    whole.zero(["param/w"])
    assert not whole.tensors["param/w"].any() and sorted(whole.tensors) == ["grad/w", "param/w"]
    with pytest.raises(ValueError, match="aliases no resident tensor"):
        whole.update({"param/v": np.zeros((4, 8))})
    del whole
    gc.collect()
    assert core.hbm_used_bytes == block.nbytes
    with pytest.raises(ValueError, match="does not fit in device memory"):
        DeviceState(core, {"huge": np.broadcast_to(np.float32(0), (1 << 20, 1 << 14))})
    assert core.hbm_used_bytes == block.nbytes  # a refused state leaves nothing behind
