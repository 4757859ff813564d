"""Runtime API: Instance / NeuronCore / LoadedModel, input checking, timing-only runs, run-time errors."""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc
import neuroncore.runtime.device as device
from neuroncore.runtime import ExecutionResult
from neuroncore.workloads import get, random_inputs


@pytest.fixture(scope="module")
def mlp_program():
    graph = get("mlp").graph(batch=16, d_model=64, d_ff=128, dtype="fp32")
    return nc.compile(graph, "trn1")


@pytest.fixture(scope="module")
def embedding_program():
    b = nc.GraphBuilder("embedding")
    ids = b.parameter("ids", (4,), "int32", low=0, high=10)
    table = b.weight("table", (10, 32), "fp32")
    return nc.compile(b.build([b.gather(table, ids)]), "trn1")


# -- instances and cores ---------------------------------------------------------------------------


def test_instance_cores():
    inst = nc.Instance("trn1.32xlarge")
    assert inst.name == "trn1.32xlarge"
    assert len(inst.cores) == 32
    core = inst.core(31)
    assert core.index == 31 and core.device == 15
    assert core.spec is nc.NC_V2
    assert inst.core() is inst.cores[0]
    trn2 = nc.Instance("trn2.48xlarge")
    assert len(trn2.cores) == 128 and trn2.core(127).device == 15 and trn2.core(0).spec is nc.NC_V3


@pytest.mark.parametrize("index", [2, -1, 100])
def test_bad_core_index(index):
    with pytest.raises(ValueError, match=rf"trn1\.2xlarge has cores 0\.\.1, not {index}"):
        nc.Instance("trn1.2xlarge").core(index)


def test_unknown_instance_type():
    with pytest.raises(ValueError, match=r"unknown instance type 'trn1\.nano'"):
        nc.Instance("trn1.nano")


def test_load_execute_returns_outputs_and_timeline(mlp_program):
    graph = mlp_program.graph
    model = nc.Instance("trn1.2xlarge").core(1).load(mlp_program)
    assert model.program is mlp_program and model.core.index == 1
    result = model.execute(random_inputs(graph, seed=0))
    assert isinstance(result, ExecutionResult)
    assert result.core == 1 and result.model_id == model.model_id and result.program is mlp_program
    assert result.outputs is not None and len(result.outputs) == 1
    assert result.outputs[0].shape == (16, 64) and result.outputs[0].dtype == np.float32
    assert result.device_time_ns == result.end_ns - result.start_ns > 0
    assert result.timeline.start_ns.shape == (mlp_program.n_nodes,)
    assert model.executions == 1


def test_inputs_by_name(mlp_program):
    graph = mlp_program.graph
    model = nc.Instance("trn1.2xlarge").core(0).load(mlp_program)
    (x,) = random_inputs(graph, seed=5)
    by_position = model.execute([x]).outputs[0]
    by_name = model.execute({"x": x}).outputs[0]
    np.testing.assert_array_equal(by_position, by_name)
    with pytest.raises(ValueError, match="missing inputs: x"):
        model.execute({"y": x})


# -- input checking --------------------------------------------------------------------------------


def test_wrong_input_shape_names_both_shapes(mlp_program):
    model = nc.Instance("trn1.2xlarge").core(0).load(mlp_program)
    bad = np.zeros((16, 32), np.float32)
    with pytest.raises(ValueError, match=r"input 'x'") as info:
        model.execute([bad])
    message = str(info.value)
    assert "[16, 32]" in message  # what was given
    assert "[16, 64]" in message  # what the program was compiled for
    # timing-only runs check shapes too, when inputs are given
    with pytest.raises(ValueError, match=r"\[16, 32\].*\[16, 64\]"):
        model.execute([bad], timing_only=True)
    assert model.executions == 0


def test_wrong_number_of_inputs(mlp_program):
    model = nc.Instance("trn1.2xlarge").core(0).load(mlp_program)
    x = np.zeros((16, 64), np.float32)
    with pytest.raises(ValueError, match="expected 1 inputs, got 2"):
        model.execute([x, x])


def test_inputs_required_unless_timing_only(mlp_program):
    model = nc.Instance("trn1.2xlarge").core(0).load(mlp_program)
    with pytest.raises(ValueError, match="inputs are required unless timing_only=True"):
        model.execute()
    assert model.execute(timing_only=True).outputs is None


# -- program / core compatibility ------------------------------------------------------------------


def test_trn2_program_cannot_load_on_trn1():
    program = nc.compile(get("mlp").graph(batch=8, d_model=32, d_ff=64), "trn2")
    with pytest.raises(ValueError, match=r"compiled for NeuronCore-v3 cannot load on NeuronCore-v2"):
        nc.Instance("trn1.2xlarge").core(0).load(program)
    with pytest.raises(ValueError, match="NeuronCore-v3"):
        nc.Instance("inf2.xlarge").core(1).load(program)
    # where it belongs, it loads and runs
    assert nc.Instance("trn2.48xlarge").core(5).load(program).execute(timing_only=True).device_time_ns > 0


def test_trn1_program_cannot_load_on_trn2(mlp_program):
    with pytest.raises(ValueError, match="NeuronCore-v2 cannot load on NeuronCore-v3"):
        nc.Instance("trn2.48xlarge").core(0).load(mlp_program)


def test_inf2_and_trn1_share_the_core(mlp_program):
    # Inferentia2 and Trainium1 both have NeuronCore-v2s
    result = nc.Instance("inf2.8xlarge").core(1).load(mlp_program).execute(timing_only=True)
    assert result.device_time_ns > 0


# -- timing-only runs ------------------------------------------------------------------------------


def test_timing_only_never_materialises_weights(mlp_program, monkeypatch):
    def forbidden(program, rank=0):
        raise AssertionError("timing-only run materialised weights")

    monkeypatch.setattr(device, "materialize_weights", forbidden)
    model = nc.Instance("trn1.2xlarge").core(0).load(mlp_program)
    result = model.execute(timing_only=True)
    assert result.outputs is None
    assert result.device_time_ns > 0
    # a numerics run does need them, through the same function
    with pytest.raises(AssertionError, match="materialised weights"):
        model.execute(random_inputs(mlp_program.graph))


def test_weights_are_materialised_once(mlp_program, monkeypatch):
    calls = []
    real = device.materialize_weights

    def counting(program, rank=0):
        calls.append(program)
        return real(program, rank)

    monkeypatch.setattr(device, "materialize_weights", counting)
    model = nc.Instance("trn1.2xlarge").core(0).load(mlp_program)
    inputs = random_inputs(mlp_program.graph)
    first = model.execute(inputs).outputs[0]
    second = model.execute(inputs).outputs[0]
    assert len(calls) == 1
    np.testing.assert_array_equal(first, second)


# -- run-time errors -------------------------------------------------------------------------------


def test_gather_in_range(embedding_program):
    model = nc.Instance("trn1.2xlarge").core(0).load(embedding_program)
    ids = np.array([0, 9, 3, 3], np.int32)
    out = model.execute([ids]).outputs[0]
    reference = nc.run_reference(embedding_program.graph, [ids])[0]
    np.testing.assert_array_equal(out, reference)


@pytest.mark.parametrize("bad", [10, -1, 1_000_000])
def test_gather_out_of_range_raises_execution_error(embedding_program, bad):
    model = nc.Instance("trn1.2xlarge").core(0).load(embedding_program)
    ids = np.array([0, 1, bad, 2], np.int32)
    with pytest.raises(nc.ExecutionError) as info:
        model.execute([ids])
    message = str(info.value)
    assert f"gather index {bad} outside table of 10 rows" in message
    assert "table" in message  # names the tensor
    assert isinstance(info.value, RuntimeError)
    # timing does not look at values
    assert model.execute([ids], timing_only=True).device_time_ns > 0


# -- device memory -----------------------------------------------------------------------------


def _holds(shape):
    """A program that keeps a large input in HBM but computes almost nothing (compiles at once)."""
    b = nc.GraphBuilder("big")
    x = b.parameter("x", shape, "bf16")
    return b.build([b.slice(x, [0, 0], [1, 128])])


def test_model_larger_than_core_hbm_is_refused_with_sizes():
    program = nc.compile(_holds((8192, 1 << 20)), "trn1")  # a 16 GiB input
    core = nc.Instance("trn1.2xlarge", sink=nc.EventSink()).core(1)
    with pytest.raises(ValueError) as info:
        core.load(program)
    text = str(info.value)
    assert "does not fit in device memory" in text and "needs 16.00 GiB" in text
    assert "input 16.00 GiB" in text and "has 16.00 GiB" in text and "core 1 (device 0)" in text
    assert "\n" not in text


def test_loaded_models_count_against_the_core():
    program = nc.compile(_holds((4096, 1_000_000)), "trn1")  # ~7.6 GiB
    core = nc.Instance("trn1.2xlarge", sink=nc.EventSink()).core(0)
    core.load(program)
    core.load(program)
    assert core.hbm_used_bytes == 2 * sum(program.hbm_bytes_by_kind().values())
    with pytest.raises(ValueError, match=r"held by 2 loaded models"):
        core.load(program)


def test_an_inconsistent_program_names_its_node_and_op(mlp_program):
    """A program whose instruction reads operands of different shapes (a compiler defect, as the
    gathered MoE router weights were) stops on one ExecutionError naming the node and its IR op,
    not a bare NumPy broadcasting error."""
    import dataclasses

    from neuroncore.compiler import node_semantics as ns

    semantics = list(mlp_program.semantics)
    node = next(i for i, s in enumerate(semantics) if isinstance(s, (ns.TensorScalar, ns.Activate))
                and s.out.rows > 1)
    s = semantics[node]
    wrong = dataclasses.replace(s.inp, p1=s.inp.p0 + s.inp.rows // 2)  # half the partitions
    semantics[node] = dataclasses.replace(s, inp=wrong)
    broken = dataclasses.replace(mlp_program, semantics=semantics)
    model = nc.Instance("trn1.2xlarge").core(0).load(broken)
    op = mlp_program.graph.ops[int(mlp_program.op_index[node])]
    with pytest.raises(nc.ExecutionError, match=rf"^node {node} \(\w+\) of {op.name} \({op.opcode}\) at "
                                               rf".* cannot run: .*broadcast"):
        model.execute(random_inputs(mlp_program.graph))
