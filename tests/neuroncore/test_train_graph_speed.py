"""Training rank programs built for compile speed compute what they did before.

The grouped-query fold (the gradient of K/V shared by several query heads) is a sum of strided
head slices, not a reduce over a middle dim (which lowered as one tiny tile per token and channel);
it must give the same values as the reduce. A step whose rank programs come from the program cache
must time exactly like one compiled afresh.
"""

from __future__ import annotations

import numpy as np
import pytest

from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.reference import run_reference
from neuroncore.workloads import train_graphs as tg


@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 1), (4, 1), (8, 2), (6, 3)])
def test_grouped_query_fold_equals_the_reduce_over_each_group(heads: int, kv_heads: int) -> None:
    shape = (1, heads, 256, 32)
    b = GraphBuilder("fold")
    g = b.parameter("g", shape, "fp32")
    folded = tg._fold_kv(b, g, kv_heads)
    reduced = b.reduce(b.reshape(g, (1, kv_heads, heads // kv_heads, 256, 32)), [2])
    graph = b.build([folded, reduced])
    assert "reduce" not in {op.opcode for op in graph.ops[: folded.index + 1]}
    x = np.random.default_rng(heads).standard_normal(shape).astype(np.float32)
    got, want = run_reference(graph, [x])
    assert got.shape == want.shape == (1, kv_heads, 256, 32)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # and by hand: KV head j is the sum of query heads j * groups .. j * groups + groups - 1
    groups = heads // kv_heads
    np.testing.assert_allclose(got[0, 0], x[0, :groups].sum(axis=0), rtol=1e-6, atol=1e-6)


def test_equal_heads_fold_nothing() -> None:
    b = GraphBuilder("fold")
    g = b.parameter("g", (1, 4, 128, 32), "fp32")
    assert tg._fold_kv(b, g, 4) is g


def test_a_cached_program_times_like_a_fresh_compile() -> None:
    """A step whose four rank programs come from the cache (every layer, stage and symmetric rank
    runs them) has the same parts, to the nanosecond, as the same step compiled afresh."""
    from neuroncore.parallel.training import clear_program_cache, time_training_step
    from neuroncore.workloads.training import get_train

    model, plan = get_train("llama-train").configure(None, tp=2, pp=2, seq=128, micro_batch=1,
                                                     global_batch=32)
    clear_program_cache()
    fresh = time_training_step(model, plan)
    cached = time_training_step(model, plan)
    assert fresh.programs_reused == 0 and cached.programs_reused == 4
    assert cached.parts == fresh.parts
    assert [p.device_ns for p in cached.programs] == [p.device_ns for p in fresh.programs]
    assert [p.instructions for p in cached.programs] == [p.instructions for p in fresh.programs]
    clear_program_cache()
    again = time_training_step(model, plan)
    assert again.programs_reused == 0 and again.parts == fresh.parts
