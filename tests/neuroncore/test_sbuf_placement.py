"""SBUF placement under pressure: no buffer is freed twice, so the free list never fragments into
overlapping ranges (the defect that made Llama-2-13B tp8 training stop on ``cannot place
constant.90.blk``: a dot's held operand block was spilled, then freed again on release)."""

from __future__ import annotations

import dataclasses

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
