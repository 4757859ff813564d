"""SBUF placement under pressure: no buffer is freed twice, so the free list never fragments into
overlapping ranges (the defect that made Llama-2-13B tp8 training stop on ``cannot place
constant.90.blk``: a dot's held operand block was spilled, then freed again on release)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler.memory import DoubleFree, RangeAllocator
from neuroncore.hardware import core_spec
from neuroncore.workloads.train_graphs import RankShapes, Transformer, layer_forward


def test_a_range_released_twice_is_refused() -> None:
    sbuf = RangeAllocator(4096)
    at, _ = sbuf.allocate(256)
    other, _ = sbuf.allocate(256)
    sbuf.release(at, 256, [])
    with pytest.raises(DoubleFree):
        sbuf.release(at, 256, [])
    with pytest.raises(DoubleFree):  # a range overlapping free space is a double free too
        sbuf.release(at + 64, 64, [])
    sbuf.release(other, 256, [])
    assert sbuf.free == [(0, 4096)] and sbuf.in_use == 0


def test_training_layer_forward_compiles_when_operand_tiles_are_spilled() -> None:
    """A Llama layer forward (tp 2, 1,024 tokens) on a core with a quarter of SBUF: attention's
    batched dots hold resident blocks of v while SBUF is full, so those tiles get spilled before the
    dot releases them. Before the fix each was freed twice, the free list fragmented and the
    gate_proj dot stopped with 'cannot place ... nothing more can be spilled'."""
    model = Transformer("llama-sbuf", 1, 1280, 10, 10, 3456, 1000)
    shapes = RankShapes.of(model, 1, 1024, 2)
    spec = dataclasses.replace(core_spec("trn1"), sbuf_bytes_per_partition=48 * 1024)
    program = nc.compile(layer_forward(model, shapes, 2, "bf16"), spec)
    assert program.stats["spilled_tiles"] > 0
    assert program.stats["sbuf_peak_bytes_per_partition"] <= spec.sbuf_bytes_per_partition


def test_llama2_7b_tp32_prefill_layer_compiles_when_a_dot_output_tile_has_no_room() -> None:
    """One Llama-2-7B layer of the tp32 trn1 prefill of 4 x 2,048 tokens (the bench grid's
    ``llama2-7b/trn1.32xlarge/tp32/b4/2048-2048``; a 4,096-token vocabulary, the layer as in the
    grid), compiled only (~2 CPU s): layer 0's gate_proj dot writes silu(x @ W) feature-major, three
    16 KiB tiles; its own blocks, partial sums and first two tiles left no free range of 16 KiB and
    nothing else was resident to spill. Before, the compile stopped with 'cannot place silu.75.t2:
    needs 16384 bytes per partition but only 14528 are free'; then that tile went to HBM as written
    (staged). Since the RMSNorm's row statistics step with their fusion group (e709753), less is
    resident at that dot and the tile fits: the grid key must still compile, with nothing staged
    (the staging itself is forced and checked by the next test)."""
    from neuroncore.parallel import TensorParallelModel
    from neuroncore.runtime import Instance
    from neuroncore.workloads import get

    graph = get("llama-prefill").graph("llama2-7b", batch=4, context=2048, tp_degree=32, layers=1,
                                       vocab=4096)
    group = TensorParallelModel.load(graph, Instance("trn1.32xlarge"), tp_degree=32)
    stats = group.program.stats
    assert stats.get("staged_tiles", 0) == 0 and stats["spilled_tiles"] > 0  # under SBUF pressure


def test_a_produced_tile_with_no_room_goes_to_hbm(monkeypatch, run, assert_close, rng) -> None:
    """A value tile that cannot be placed when its producer writes it (every spillable tile spilled,
    no free range wide enough) is written through staging buffers to HBM and read back from there
    by its readers: the results are the same. The allocation of ``silu(x @ w)``'s second tile is
    made to fail as in the 7B prefill above (before: the compile stopped there)."""
    from neuroncore.compiler import context as ctx_module
    from neuroncore.compiler.errors import CompileError

    b = nc.GraphBuilder("staged_tile")
    x = b.parameter("x", (384, 256), "fp32")
    w = b.parameter("w", (256, 192), "fp32")
    h = b.silu(b.matmul(x, w))
    g = b.build([b.multiply(h, b.add(h, 1.0))])
    alloc = ctx_module.Context.alloc
    refused: list[str] = []

    def no_room_for_tile_1(self, partitions, free, dtype, name, **kwargs):
        if name.startswith("silu.") and name.endswith(".t1") and not refused:  # when produced
            refused.append(name)
            raise CompileError(f"cannot place {name}: no room (test)", self.current_op)
        return alloc(self, partitions, free, dtype, name, **kwargs)

    monkeypatch.setattr(ctx_module.Context, "alloc", no_room_for_tile_1)
    xs = rng.standard_normal((384, 256)).astype(np.float32) / 16
    ws = rng.standard_normal((256, 192)).astype(np.float32)
    res = run(g, [xs, ws])
    assert refused and res.program.stats["staged_tiles"] == 1
    assert_close(res.out, res.ref, "fp32")


def test_a_tile_spilled_between_its_producers_column_blocks_keeps_the_columns_written(
        monkeypatch, run, assert_close, rng) -> None:
    """A dot writes its output tile a column block at a time and unpins it after each block, so the
    tile can be spilled half written (seen in the Llama-2-7B decode's gate_proj and the 70B tp32
    rank). The next block must bring back the columns written so far before writing more, and the
    HBM copy is stale from then on. Before, the next block wrote into a fresh buffer: the first
    columns were lost (wrong results) and a later spill skipped the store (the tile was marked as in
    HBM). Here tile 0 of ``x @ w`` (512 columns per block) is spilled when its third block starts."""
    from neuroncore.compiler import context as ctx_module

    b = nc.GraphBuilder("spilled_half_written")
    x = b.parameter("x", (128, 256), "fp32")
    w = b.parameter("w", (256, 1536), "fp32")
    g = b.build([b.multiply(b.matmul(x, w), 2.0)])
    produce = ctx_module.Context.produce
    spilled: list[str] = []

    def spill_tile_0_at_its_third_block(self, op, t, c0=0, c1=None, rows=None):
        value = self.values[op.index]
        if op.opcode == "dot" and t == 0 and c0 == 1024 and value.bufs[0] is not None:
            self.pinned.discard(value.bufs[0].id)
            self._spill_tile(value, 0)
            spilled.append(op.name)
        return produce(self, op, t, c0, c1, rows)

    monkeypatch.setattr(ctx_module.Context, "produce", spill_tile_0_at_its_third_block)
    xs = rng.standard_normal((128, 256)).astype(np.float32)
    ws = rng.standard_normal((256, 1536)).astype(np.float32)
    res = run(g, [xs, ws])
    assert spilled
    assert_close(res.out, res.ref, "fp32")
