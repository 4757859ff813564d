"""Tiling of dot to the PE limits, K accumulation, PSUM banks, SBUF spills and over-large tiles.

PE limits (neuroncore.md): contraction K <= 128 rows, stationary free (M) <= 128, moving free (N)
<= 512 = one 2 KiB PSUM bank of FP32, 8 banks. Every MATMUL of every program here is checked against
them, from both its operand text (``... KxMxN``) and its semantics tuple.
"""

from __future__ import annotations

import math
import os
import re
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import neuroncore as nc
from neuroncore.compiler.node_semantics import Activate, Load, LoadWeights, MatMul, Nop
from neuroncore.enums import Memory
from neuroncore.hardware import NC_V2, Engine, with_overrides

THIS_FILE = os.path.abspath(__file__)
TENSOR, VECTOR = int(Engine.TENSOR), int(Engine.VECTOR)
NP_TYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16}
SMALL_SBUF = with_overrides(NC_V2, sbuf_bytes_per_partition=16 * 1024)
SHAPE_SUFFIX = re.compile(r" (\d+)x(\d+)x(\d+)$")


def _line() -> int:
    return sys._getframe(1).f_lineno


def opcode(program: nc.Program, i: int) -> str:
    return program.opcodes[program.opcode_id[i]]


def _matmul(program: nc.Program, i: int) -> MatMul:
    sem = program.semantics[i]
    assert isinstance(sem, MatMul), sem
    return sem


def _activate(program: nc.Program, i: int) -> Activate:
    sem = program.semantics[i]
    assert isinstance(sem, Activate), sem
    return sem


def check_pe_limits(program: nc.Program) -> dict[str, int]:
    """Every LDWEIGHTS/MATMUL obeys the PE limits; returns counts for further checks."""
    spec = program.spec
    bank_cols = spec.psum_bank_bytes_per_partition // 4
    stationary = None
    counts = {"ldweights": 0, "matmul": 0, "transpose": 0}
    for i in range(program.n_nodes):
        code = opcode(program, i)
        if code == "LDWEIGHTS":
            sem = program.semantics[i]
            assert isinstance(sem, LoadWeights)
            ref = sem.stationary
            assert program.engine[i] == TENSOR
            assert 1 <= ref.rows <= spec.max_contraction, "K rows of the stationary operand"
            assert 1 <= ref.cols <= spec.max_stationary_free, "stationary free size"
            assert program.buffers[ref.buf].memory is Memory.SBUF
            stationary = ref
            counts["ldweights"] += 1
        elif code == "MATMUL":
            assert program.engine[i] == TENSOR
            text = program.operands[i]
            match = SHAPE_SUFFIX.search(text)
            assert match, text
            k, m, n = (int(v) for v in match.groups())
            assert 1 <= k <= spec.max_contraction, text
            assert 1 <= m <= spec.max_stationary_free, text
            assert 1 <= n <= spec.max_moving_free, text
            assert stationary is not None, "a MATMUL needs weights loaded first"
            assert (stationary.rows, stationary.cols) == (k, m), text
            sem = program.semantics[i]
            if isinstance(sem, MatMul):
                psum, moving, accumulate, transpose = sem.psum, sem.moving, sem.accumulate, sem.transpose
                assert (moving.rows, moving.cols) == (k, n)
                assert (psum.rows, psum.cols) == (m, n)
                assert program.buffers[moving.buf].memory is Memory.SBUF
                psum_buf = program.buffers[psum.buf]
                assert psum_buf.memory is Memory.PSUM
                assert psum.f1 <= bank_cols, "a MATMUL writes within one PSUM bank"
                bank = psum_buf.address // spec.psum_bank_bytes_per_partition
                assert 0 <= bank < spec.psum_banks
                assert f"psum[{bank}]" in text
                assert accumulate == ("acc=middle" in text or "acc=last" in text)
                assert transpose == (program.tensor_instruction_type[i] == "TRANSPOSE")
                counts["transpose" if transpose else "matmul"] += 1
            else:
                assert sem == Nop() and "fp32_pass=hi" in text  # second FP32 pass
    return counts


def dot_graph(m: int, k: int, n: int, dtype: str, *, rhs: str = "parameter", lhs: str = "parameter",
              lhs_contract: int = -1, rhs_contract: int = -2, batch: tuple[int, ...] = ()):
    """``dot`` of [*batch, M, K] x [*batch, K, N] (operands laid out per the contracting dims)."""
    b = nc.GraphBuilder("tiling")
    lshape = (*batch, m, k) if lhs_contract == -1 else (*batch, k, m)
    rshape = (*batch, k, n) if rhs_contract == -2 else (*batch, n, k)
    a = b.parameter("a", lshape, dtype)
    if lhs == "onchip":
        a = b.negate(a)
    with b.scope("proj"):
        if rhs == "weight":
            w = b.weight("w", rshape, dtype)
        else:
            w = b.parameter("w", rshape, dtype)
            if rhs == "onchip":
                w = b.negate(w)
        y = b.dot(a, w, lhs_contract=lhs_contract, rhs_contract=rhs_contract)
    g = b.build([y])
    return g, y, lshape, rshape


def numpy_dot(g: nc.Graph, inputs: list[np.ndarray]) -> np.ndarray:
    """Independent float64 value of the single dot in ``g`` (negates and weights applied)."""
    values: dict[int, np.ndarray] = {}
    for p, v in zip(g.parameters, inputs):
        values[p.index] = np.asarray(v, np.float32).astype(NP_TYPES[p.dtype.value]).astype(np.float64)
    out = None
    for op in g.ops:
        if op.opcode == "negate":
            values[op.index] = -values[op.operands[0].index]
        elif op.opcode == "constant":
            init = op.attrs["init"].materialize(op.shape)
            values[op.index] = init.astype(NP_TYPES[op.dtype.value]).astype(np.float64)
        elif op.opcode == "dot":
            a, w = (values[o.index] for o in op.operands)
            nd = a.ndim
            a = a if op.attrs["lhs_contract"] == nd - 1 else np.swapaxes(a, -1, -2)
            w = w if op.attrs["rhs_contract"] == nd - 2 else np.swapaxes(w, -1, -2)
            out = np.einsum("...mk,...kn->...mn", a, w)
    assert out is not None
    return out


def inputs_for(g: nc.Graph, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(p.shape).astype(np.float32) for p in g.parameters]


def regular_matmuls(program: nc.Program, op) -> list[int]:
    return [i for i in range(program.n_nodes)
            if opcode(program, i) == "MATMUL" and program.op_index[i] == op.index
            and program.tensor_instruction_type[i] == "REGULAR"]


# ---------------------------------------------------------------------------------------------
# shapes that are not multiples of the PE tile
# ---------------------------------------------------------------------------------------------

ODD_SHAPES = [
    (1, 1, 1), (1, 7, 129), (7, 129, 200), (129, 7, 513), (200, 513, 7), (513, 200, 129),
    (129, 129, 513), (7, 1, 1), (1, 200, 513),
]


@pytest.mark.parametrize("rhs", ["parameter", "weight"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("m,k,n", ODD_SHAPES)
def test_dot_odd_shapes(run, assert_close, m, k, n, dtype, rhs):
    g, y, _, _ = dot_graph(m, k, n, dtype, rhs=rhs)
    inputs = inputs_for(g, m * 10_000 + k * 100 + n)
    res = run(g, inputs)
    assert res.out.shape == (m, n)
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, numpy_dot(g, inputs), dtype)
    counts = check_pe_limits(res.program)
    # one (M tile, K tile, N chunk) MATMUL each; FP32 has a second pass per MATMUL
    assert counts["matmul"] == math.ceil(m / 128) * math.ceil(k / 128) * math.ceil(n / 512)
    passes = 2 if dtype == "fp32" else 1
    assert len(regular_matmuls(res.program, y)) == passes * counts["matmul"]
    # lhs [M, K] contracts its free dim: it is transposed on the PE in <= 128x128 blocks
    assert counts["transpose"] == math.ceil(m / 128) * math.ceil(k / 128)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("k", [129, 300, 513])
def test_k_over_128_accumulates_in_psum(run, assert_close, k, dtype):
    m, n = 130, 96
    g, y, _, _ = dot_graph(m, k, n, dtype, lhs_contract=-2)
    inputs = inputs_for(g, k)
    res = run(g, inputs)
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, numpy_dot(g, inputs), dtype)
    program = res.program
    check_pe_limits(program)
    assert program.stats["dot_plans"][y.name][2] == k, "whole K in one block: PSUM accumulation"
    k_tiles = math.ceil(k / 128)
    # group the numerics-carrying MATMULs by the PSUM buffer they accumulate into
    groups: dict[int, list[int]] = {}
    for i in regular_matmuls(program, y):
        sem = program.semantics[i]
        if isinstance(sem, MatMul):
            groups.setdefault(sem.psum.buf, []).append(i)
    assert len(groups) == math.ceil(m / 128) * math.ceil(n / 512)
    for nodes in groups.values():
        assert len(nodes) == k_tiles
        positions = [re.search(r"acc=(\w+)", program.operands[i]).group(1) for i in nodes]
        assert positions == ["first", *["middle"] * (k_tiles - 2), "last"]
        matmuls = [program.semantics[i] for i in nodes]
        assert all(isinstance(sem, MatMul) for sem in matmuls)
        assert [sem.accumulate for sem in matmuls] == [False] + [True] * (k_tiles - 1)
        assert sum(sem.moving.rows for sem in matmuls) == k  # the K tiles cover K
        # the K tiles are 128 rows, the last one partial
        last_rows = k - 128 * (k_tiles - 1)
        assert [sem.moving.rows for sem in matmuls] == [128] * (k_tiles - 1) + [last_rows]
    if dtype == "fp32":
        texts = [program.operands[i] for i in regular_matmuls(program, y)]
        assert sum("fp32_pass=lo" in t for t in texts) == sum("fp32_pass=hi" in t for t in texts)
    # nothing is accumulated on Vector: PSUM did it
    assert not any(opcode(program, i) == "TENSOR_TENSOR" and program.op_index[i] == y.index
                   for i in range(program.n_nodes))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("n", [513, 1100, 2100])
def test_n_over_512_uses_several_psum_banks(run, assert_close, n, dtype):
    m, k = 20, 64
    g, y, _, _ = dot_graph(m, k, n, dtype, rhs="weight")
    inputs = inputs_for(g, n)
    res = run(g, inputs)
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, numpy_dot(g, inputs), dtype)
    program = res.program
    check_pe_limits(program)
    chunks = math.ceil(n / 512)
    # after each LDWEIGHTS of the dot, its MATMULs write distinct banks, at most 4 at a time
    groups: list[list[int]] = []
    for i in range(program.n_nodes):
        if program.op_index[i] != y.index:
            continue
        if opcode(program, i) == "LDWEIGHTS":
            groups.append([])
        elif (opcode(program, i) == "MATMUL" and isinstance(program.semantics[i], MatMul)
              and program.tensor_instruction_type[i] == "REGULAR"):
            groups[-1].append(i)
    groups = [grp for grp in groups if grp]
    assert sum(len(grp) for grp in groups) == chunks
    assert [len(grp) for grp in groups] == [min(4, chunks - 4 * j) for j in range(len(groups))]
    for grp in groups:
        banks = [program.buffers[_matmul(program, i).psum.buf].address // 2048 for i in grp]
        assert len(set(banks)) == len(banks), "each 512-column chunk has its own PSUM bank"
    widths = [_matmul(program, i).moving.cols for grp in groups for i in grp]
    assert widths == [512] * (chunks - 1) + [n - 512 * (chunks - 1)]
    if chunks > 1:
        used = {program.buffers[_matmul(program, i).psum.buf].address // 2048
                for grp in groups for i in grp}
        assert len(used) > 1


def test_k_split_across_blocks_accumulates_in_sbuf(run, assert_close, monkeypatch):
    """With a small SBUF the planner splits K; a block too large to keep its sums in PSUM across
    k-blocks (here: no banks allowed for it) adds its partial sums on Vector in FP32."""
    from neuroncore.compiler import lower_matmul

    monkeypatch.setattr(lower_matmul, "PSUM_ACCUMULATION_BANKS", 0)
    g, y, _, _ = dot_graph(130, 1000, 700, "fp32")
    inputs = inputs_for(g, 7)
    program = nc.compile(g, SMALL_SBUF)
    kb = program.stats["dot_plans"][y.name][2]
    assert kb < 1000
    check_pe_limits(program)
    result = nc.Instance("trn1.2xlarge").core(0).load(program).execute(inputs)
    reference = nc.run_reference(g, inputs)
    assert_close(result.outputs[0], reference[0], "fp32")
    assert_close(result.outputs[0], numpy_dot(g, inputs), "fp32")
    adds = [i for i in range(program.n_nodes)
            if opcode(program, i) == "TENSOR_TENSOR" and program.op_index[i] == y.index]
    assert adds and all(program.engine[i] == VECTOR and "op=add" in program.operands[i]
                        and "psum[" in program.operands[i] for i in adds)
    k_blocks = math.ceil(1000 / kb)
    assert len(adds) == (k_blocks - 1) * math.ceil(130 / 128) * math.ceil(700 / 512)
    assert program.sbuf_read_bytes.sum() > 0 and program.stats["sbuf_peak_bytes_per_partition"] <= 16 * 1024
    # the same program on the full-size SBUF needs no split and gives the same result
    full = run(g, inputs)
    assert full.program.stats["dot_plans"][y.name][2] == 1000
    assert_close(result.outputs[0], full.out, "fp32")


def test_k_split_across_blocks_accumulates_in_psum(assert_close):
    """A split-K block whose outputs fit a few PSUM banks keeps its sums there across its
    k-blocks (the NKI matmul tutorial's accumulation over every K tile): the MATMULs of later
    k-blocks add to the banks, one evacuation per bank at the end, no partial sums on Vector."""
    g, y, _, _ = dot_graph(130, 1000, 700, "fp32")
    inputs = inputs_for(g, 7)
    program = nc.compile(g, SMALL_SBUF)
    kb = program.stats["dot_plans"][y.name][2]
    assert kb < 1000
    check_pe_limits(program)
    nodes = [i for i in range(program.n_nodes) if program.op_index[i] == y.index]
    assert not [i for i in nodes if opcode(program, i) == "TENSOR_TENSOR"]
    matmuls = [program.operands[i] for i in nodes if opcode(program, i) == "MATMUL"]
    k_tiles, banks = math.ceil(1000 / 128), math.ceil(130 / 128) * math.ceil(700 / 512)
    passes = 2  # an FP32 MATMUL is two passes, each shown with its group position
    assert sum("acc=first" in t for t in matmuls) == banks * passes  # one group per bank over all K
    assert sum("acc=last" in t for t in matmuls) == banks * passes
    assert sum("acc=middle" in t for t in matmuls) == banks * (k_tiles - 2) * passes
    result = nc.Instance("trn1.2xlarge").core(0).load(program).execute(inputs)
    assert_close(result.outputs[0], nc.run_reference(g, inputs)[0], "fp32")
    assert_close(result.outputs[0], numpy_dot(g, inputs), "fp32")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_batched_dot_tiles_each_batch(run, assert_close, dtype):
    g, _, _, _ = dot_graph(130, 200, 600, dtype, batch=(2, 2), lhs="onchip", rhs_contract=-1)
    inputs = inputs_for(g, 11)
    res = run(g, inputs)
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, numpy_dot(g, inputs), dtype)
    counts = check_pe_limits(res.program)
    assert counts["matmul"] == 4 * 2 * 2 * 2  # batches x M tiles x K tiles x N chunks


# ---------------------------------------------------------------------------------------------
# property test: random small shapes, dtypes, contracting dims and operand placements
# ---------------------------------------------------------------------------------------------

dims = st.one_of(st.integers(1, 140), st.sampled_from([127, 128, 129, 255, 256, 257, 300]))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(m=dims, k=dims, n=st.one_of(dims, st.sampled_from([511, 512, 513, 700])),
       dtype=st.sampled_from(["fp32", "bf16"]),
       lhs_contract=st.sampled_from([-1, -2]), rhs_contract=st.sampled_from([-1, -2]),
       lhs=st.sampled_from(["parameter", "onchip"]), rhs=st.sampled_from(["parameter", "weight", "onchip"]),
       batch=st.sampled_from([(), (2,)]), seed=st.integers(0, 2**16))
def test_dot_property(run, assert_close, m, k, n, dtype, lhs_contract, rhs_contract, lhs, rhs,
                      batch, seed):
    g, _, _, _ = dot_graph(m, k, n, dtype, lhs=lhs, rhs=rhs, lhs_contract=lhs_contract,
                           rhs_contract=rhs_contract, batch=batch)
    inputs = inputs_for(g, seed)
    res = run(g, inputs)
    assert res.out.shape == (*batch, m, n)
    expected = numpy_dot(g, inputs)
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, expected, dtype)
    counts = check_pe_limits(res.program)
    batches = math.prod(batch)
    assert counts["matmul"] == batches * math.ceil(m / 128) * math.ceil(k / 128) * math.ceil(n / 512)


# ---------------------------------------------------------------------------------------------
# SBUF: spills when the working set does not fit, errors when a single tile cannot
# ---------------------------------------------------------------------------------------------


def _wide_working_set(cols: int, count: int = 6):
    """``count`` [128, cols] FP32 intermediates, all alive until a final sum."""
    b = nc.GraphBuilder("spill")
    x = b.parameter("x", (128, cols), "fp32")
    with b.scope("branches"):
        parts = [b.multiply(b.exp(x), float(i + 1)) for i in range(count)]
    with b.scope("sum"):
        total = parts[0]
        for part in parts[1:]:
            total = b.add(total, part)
    return b.build([total])


def test_sbuf_spill_and_reload(run, assert_close):
    # each intermediate is 4 KiB per partition (small enough to live in SBUF); six of them do not
    # fit in 16 KiB
    g = _wide_working_set(1024)
    inputs = [np.random.default_rng(3).standard_normal((128, 1024)).astype(np.float32)]
    program = nc.compile(g, SMALL_SBUF)
    assert program.spill_save_bytes.sum() > 0
    assert program.spill_reload_bytes.sum() > 0
    assert program.stats["spilled_tiles"] > 0
    assert program.stats["spill_save_bytes"] == program.spill_save_bytes.sum()
    assert program.stats["spill_reload_bytes"] == program.spill_reload_bytes.sum()
    assert program.stats["sbuf_peak_bytes_per_partition"] <= 16 * 1024
    queues = {program.queues[program.queue[i]].name for i in range(program.n_nodes)
              if program.resource[i] == 6}
    # reloads are triggered from GpSimd, off the Sync stream that issues the weight loads
    assert "qGpSimdSpillReload0" in queues
    # spill traffic is DMA on spill/reload queues, into scratch tensors in HBM
    spill_nodes = np.flatnonzero((program.spill_save_bytes > 0) | (program.spill_reload_bytes > 0))
    for i in spill_nodes:
        transfer = i + 1  # the counters sit on the trigger; its transfer follows it
        assert program.resource[transfer] == 6 and program.trigger[transfer] == i
        assert "SpillReload" in program.queues[program.queue[transfer]].name
    reloads = [i for i in range(program.n_nodes) if program.resource[i] == 6
               and program.queues[program.queue[i]].name == "qGpSimdSpillReload0"]
    assert reloads and all(isinstance(program.semantics[i], Load) for i in reloads)
    assert any(t.kind == "scratch" and t.name.startswith("spill.") for t in program.hbm_tensors.values())
    result = nc.Instance("trn1.2xlarge").core(0).load(program).execute(inputs)
    reference = nc.run_reference(g, inputs)
    assert_close(result.outputs[0], reference[0])
    expected = np.exp(inputs[0].astype(np.float64)) * sum(range(1, 7))
    assert_close(result.outputs[0], expected)
    # the full-size core keeps everything on chip and computes the same values
    full = run(g, inputs)
    assert full.program.spill_save_bytes.sum() == 0 and full.program.spill_reload_bytes.sum() == 0
    np.testing.assert_array_equal(full.out, result.outputs[0])


def test_working_set_that_fits_does_not_spill():
    program = nc.compile(_wide_working_set(256), SMALL_SBUF)
    assert program.spill_save_bytes.sum() == 0 and program.spill_reload_bytes.sum() == 0


@pytest.mark.parametrize("spec,shape", [(SMALL_SBUF, (4, 8192)), (NC_V2, (1, 64 * 1024))])
def test_oversized_tile_is_a_compile_error(spec, shape):
    # softmax needs its whole row on chip at once: a row wider than SBUF cannot be placed
    b = nc.GraphBuilder("huge")
    x = b.parameter("x", shape, "fp32")
    with b.scope("block"):
        y, line = b.softmax(x), _line()
    g = b.build([y])
    with pytest.raises(nc.CompileError) as info:
        nc.compile(g, spec)
    err = info.value
    text = str(err)
    assert err.op is y
    assert y.name in text and "(softmax)" in text
    assert "model/block" in text
    assert f"{THIS_FILE}:{line}" in text
    assert f"{shape[-1] * 4} bytes per partition" in text
    assert str(spec.sbuf_bytes_per_partition) in text


@pytest.mark.parametrize("spec,shape", [(SMALL_SBUF, (4, 8192)), (NC_V2, (2, 64 * 1024))])
def test_wide_elementwise_rows_are_processed_in_slices(spec, shape):
    """Elementwise ops do not need a whole row on chip: they work in slices of the free dim."""
    b = nc.GraphBuilder("wide")
    x = b.parameter("x", shape, "fp32")
    y = b.parameter("y", shape, "fp32")
    g = b.build([b.multiply(b.exp(x), y)])
    program = nc.compile(g, spec)
    ops = [program.opcodes[program.opcode_id[i]] for i in range(program.n_nodes)]
    activations = [i for i, o in enumerate(ops) if o == "ACTIVATE"]
    widths = [_activate(program, i).out.cols for i in activations]
    assert len(activations) > 1 and max(widths) * 4 <= min(16 * 1024, spec.sbuf_bytes_per_partition // 8)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(shape).astype(np.float32) * 0.1 for _ in range(2)]
    out = nc.Instance(sink=nc.EventSink()).core(0).load(program).execute(xs).outputs[0]
    np.testing.assert_allclose(out, np.exp(xs[0]) * xs[1], rtol=1e-5, atol=1e-6)
