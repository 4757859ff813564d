"""Busy time per bucket (``formats.figures.busy_rows`` over ``covered_per_bucket`` over
``busy_per_bucket``): exact, agreeing with the busy figures over the same window."""

from __future__ import annotations

import numpy as np
import pytest

from formats.dataset import find_profiles
from formats.figures import (
    RowSelect,
    Window,
    busiest_opcodes,
    busy_rows,
    covered_per_bucket,
    engine_busy,
    track_busy,
)
from formats.reader import open_profile
from tests.fixtures.samples import BERT, LLAMA_TP2


def test_covered_per_bucket_against_a_brute_force() -> None:
    rng = np.random.default_rng(3)
    starts = np.sort(rng.integers(0, 10_000, 400))
    ends = starts + rng.integers(1, 60, 400)
    grid = np.zeros(12_000, bool)
    for s, e in zip(starts, ends):
        grid[s:e] = True
    # merge into disjoint segments the way UnionAccumulator hands them over
    edges = np.flatnonzero(np.diff(np.r_[0, grid.astype(np.int8), 0]))
    seg_s, seg_e = edges[0::2], edges[1::2]
    got = covered_per_bucket(seg_s, seg_e, 1_000, 9_000, 40)
    want = grid[1_000:9_000].reshape(40, -1).sum(axis=1)
    np.testing.assert_allclose(got, want)
    assert covered_per_bucket(np.zeros(0), np.zeros(0), 0, 10, 5).tolist() == [0.0] * 5


@pytest.mark.parametrize("path", [BERT, LLAMA_TP2])
def test_buckets_add_up_to_the_figures_busy_time(path) -> None:  # type: ignore[no-untyped-def]
    profile = open_profile(find_profiles(path)[0][0].path)
    first, last = profile.metadata["first_hw_timestamp"], profile.metadata["last_hw_timestamp"]
    for t0, t1 in ((first, last), (first + (last - first) // 3, first + (last - first) // 2)):
        rows = [RowSelect("Tensor", engines=("Tensor",)), RowSelect("LS", tracks=("Tensor",)),
                RowSelect("MM", tracks=("TensorMatrix",)), RowSelect("Vector", engines=("Vector",))]
        cov = {k: b.fraction for k, b in busy_rows(profile, t0, t1, 97, rows, use_active_time=False).items()}
        stored = busy_rows(profile, t0, t1, 97, rows)  # whole-engine rows from ActiveTime: the same union
        np.testing.assert_allclose(stored["Tensor"].fraction, cov["Tensor"], atol=1e-9)
        window = Window.span(t0, t1)
        engines, tracks = engine_busy(profile, window), track_busy(profile, window)
        assert cov["Tensor"].mean() == pytest.approx(engines["Tensor"].fraction, abs=1e-9)
        assert cov["Vector"].mean() == pytest.approx(engines["Vector"].fraction, abs=1e-9)
        assert cov["LS"].mean() == pytest.approx(tracks["Tensor"].fraction, abs=1e-9)
        assert cov["MM"].mean() == pytest.approx(tracks["TensorMatrix"].fraction, abs=1e-9)
        assert np.all(cov["Tensor"] <= 1 + 1e-9) and np.all(cov["Tensor"] >= cov["MM"] - 1e-9)


def test_busiest_opcode_per_row() -> None:
    profile = open_profile(find_profiles(BERT)[0][0].path)
    t0, t1 = profile.metadata["first_hw_timestamp"], profile.metadata["last_hw_timestamp"]
    top = busiest_opcodes(profile, t0, t1, [RowSelect("LS", tracks=("Tensor",)),
                                             RowSelect("MM", tracks=("TensorMatrix",)),
                                             RowSelect("G", engines=("GpSimd",))])
    # GpSimd's busiest: the DMA triggers of relayout loads (qGpSimdData0), then IOTA
    assert top == {"LS": "LDWEIGHTS", "MM": "MATMUL", "G": "WRITE"}
    assert busiest_opcodes(profile, t1 - 1, t1, [RowSelect("G", engines=("GpSimd",))]) == {"G": ""}
