"""Index updates (neuroncore/frontends/torch_scatter.py) against torch: KV-cache writes and the
functional forms of in-place writes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import neuroncore as nc  # noqa: E402


def _same(fn, *inputs):
    traced = nc.trace(fn, inputs)
    got, want = traced(*inputs), fn(*inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not [op for op in traced.graph.ops if op.opcode.startswith("aten.")]


def test_kv_cache_write_at_runtime_positions():
    cache = torch.randn(2, 2, 8, 4)
    new = torch.randn(2, 2, 3, 4)
    positions = torch.tensor([5, 6, 7])
    _same(lambda k, v, p: k.index_copy(2, p, v), cache, new, positions)  # StaticCache.update

    def put(k, v, p):
        k = k.clone()
        k[:, :, p] = v
        return k

    _same(put, cache, new, torch.tensor([0, 3, -1]))


def test_constant_position_writes_and_scatter():
    def writes(x, y):
        x = x.clone()
        x[:, 1:3] = y
        x[0] = 0.5
        return x

    _same(writes, torch.randn(3, 5), torch.randn(3, 2))
    src = torch.randn(2, 3)
    index = torch.tensor([[2, 0, 1], [0, 2, 3]])
    _same(lambda s, i: torch.zeros(2, 4).scatter(1, i, s), src, index)
    _same(lambda i: torch.zeros(2, 4).scatter(1, i, 1.0), index)  # a one-hot mask
