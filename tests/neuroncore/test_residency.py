"""Values over a quarter of SBUF stay on chip when their live set fits (compiler.residency)."""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc
import neuroncore.compiler as compiler_pkg
from neuroncore.compiler.residency import kept_on_chip
from neuroncore.hardware import core_spec
from neuroncore.ir.graph import Op
from tests.fixtures.placement import run_placements

SPEC = core_spec("inf2")
QUARTER = SPEC.sbuf_bytes_per_partition // 4  # 48 KiB per partition
HALF = SPEC.sbuf_bytes_per_partition // 2
ROWS, COLS = 256, 8192  # two row tiles x 32 KiB: 64 KiB per partition, over the quarter


def _chain() -> tuple[nc.Graph, Op]:
    """y = exp(x) is 64 KiB per partition and lives alone until its reader, a matmul (which
    never joins a fusion group, so y is no group's internal value): its live set fits."""
    b = nc.GraphBuilder("kept")
    x = b.parameter("x", (ROWS, COLS), "fp32")
    y = b.exp(x)
    z = b.matmul(y, b.weight("w", (COLS, 128), "fp32"))
    return b.build([z]), y


def _scratch(program: nc.Program) -> set[str]:
    return {t.name for t in program.hbm_tensors.values() if t.kind.name == "SCRATCH"}


def test_a_value_over_the_quarter_whose_live_set_fits_stays_on_chip(assert_close):
    graph, y = _chain()
    assert kept_on_chip(graph, QUARTER, HALF) == {y.index}  # the parameter is an input: HBM
    program = nc.compile(graph, "inf2")
    with pytest.MonkeyPatch.context() as mp:  # the fixed rule alone: over the quarter -> HBM
        mp.setattr(compiler_pkg, "RESIDENT_SBUF_FRACTION", 0.0)
        before = nc.compile(graph, "inf2")
    assert y.name in _scratch(before)  # stored to HBM and read back by the matmul
    assert y.name not in _scratch(program)
    assert program.stats["kept_large_values"] == 1
    inputs = [np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32) * 0.5]
    kept = run_placements(program, before, inputs)  # the same values: only where y lives changed
    assert_close(kept.out, nc.run_reference(graph, inputs)[0], "fp32")
    assert kept.time_a_ns < kept.time_b_ns  # no store, no reloads


def test_a_value_whose_live_set_does_not_fit_stays_in_hbm():
    """Two 64 KiB values live at once are 128 KiB, over half of SBUF: the first (in program
    order) is kept, the second is not."""
    b = nc.GraphBuilder("two")
    x = b.parameter("x", (ROWS, COLS), "fp32")
    w = b.weight("w", (COLS, 128), "fp32")
    y1 = b.exp(x)
    y2 = b.tanh(x)
    graph = b.build([b.add(b.matmul(y1, w), b.matmul(y2, w))])
    assert kept_on_chip(graph, QUARTER, HALF) == {y1.index}
    assert kept_on_chip(graph, QUARTER, 2 * HALF) == {y1.index, y2.index}
    program = nc.compile(graph, "inf2")
    assert y1.name not in _scratch(program) and y2.name in _scratch(program)
