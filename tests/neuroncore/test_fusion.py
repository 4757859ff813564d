"""What the compiler keeps on chip instead of going through HBM (docs/execution-core.md, "Fusion").

Attention's head split and merge are read in place or assembled by engine copies (on-chip views);
numerics must not change, and no scratch tensor may appear in HBM for them.
"""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler.lowering_state import HbmTensorKind

S, H, D = 128, 4, 32
E = H * D


def _attention(dtype: str = "fp32") -> tuple[nc.Graph, list[np.ndarray]]:
    g = nc.GraphBuilder()
    x = g.parameter("x", (S, E), dtype)
    heads = []
    for name in ("q", "k", "v"):
        w = g.weight(f"w{name}", (E, E), dtype)
        y = g.dot(x, w)
        y = g.reshape(y, (1, S, H, D))
        heads.append(g.transpose(y, (0, 2, 1, 3)))  # [1, H, S, D]
    q, k, v = (g.reshape(h, (H, S, D)) for h in heads)
    scores = g.dot(q, k, rhs_contract=-1)  # [H, S, S]
    probs = g.softmax(g.multiply(scores, 1.0 / np.sqrt(D)))
    out = g.dot(probs, v)  # [H, S, D]
    merged = g.reshape(g.transpose(g.reshape(out, (1, H, S, D)), (0, 2, 1, 3)), (S, E))
    wo = g.weight("wo", (E, E), dtype)
    graph = g.build([g.dot(merged, wo)])
    rng = np.random.default_rng(0)
    return graph, [rng.standard_normal((S, E)).astype(np.float32)]


@pytest.fixture(scope="module")
def attention_run(run):
    graph, inputs = _attention()
    return run(graph, inputs)


def test_head_split_and_merge_stay_on_chip(attention_run, assert_close):
    program = attention_run.program
    scratch = [t.name for t in program.hbm_tensors.values() if t.kind is HbmTensorKind.SCRATCH]
    assert scratch == [], f"head split/merge went through HBM: {scratch}"
    assert program.hbm_views == {}
    assert program.stats["on_chip_views"] >= 3  # q, k and v heads read in place
    assert program.stats["on_chip_view_copies"] >= 1  # the merge: one copy per head
    assert_close(attention_run.out, attention_run.ref)


def test_a_view_of_a_value_in_hbm_still_reads_through_a_dma_view(run, assert_close):
    """Rows that move across partitions cannot be engine copies: the HBM view stays."""
    g = nc.GraphBuilder()
    x = g.parameter("x", (8, 16, 64))
    y = g.exp(x)
    t = g.transpose(y, (1, 0, 2))  # rows of one tile spread over 16 tiles
    graph = g.build([g.add(t, 1.0)])
    inputs = [np.random.default_rng(1).standard_normal((8, 16, 64)).astype(np.float32)]
    result = run(graph, inputs)
    assert result.program.hbm_views, "expected the transpose to be read through an HBM view"
    assert_close(result.out, result.ref)
