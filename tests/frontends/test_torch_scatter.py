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


def test_strided_slice_writes():
    """slice_scatter with a step: the backward of a strided slice (GPT-J's rotary ``x[..., ::2]``),
    including a last stride that runs past the end (positions 1, 4, 7 of 8)."""
    x = torch.randn(2, 8, 3)
    _same(lambda a, b: torch.slice_scatter(a, b, dim=1, start=0, end=None, step=2), x, torch.randn(2, 4, 3))
    _same(lambda a, b: torch.slice_scatter(a, b, dim=1, start=1, end=None, step=3), x, torch.randn(2, 3, 3))
    _same(lambda a, b: torch.slice_scatter(a, b, dim=2, start=1, end=3, step=2), x, torch.randn(2, 8, 1))


def _close(fn, *inputs):
    """Accumulating updates sum in another order than torch: equal to rounding."""
    traced = nc.trace(fn, inputs)
    got, want = traced(*inputs), fn(*inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not [op for op in traced.graph.ops if op.opcode.startswith("aten.")]
    return traced


def test_index_add_repeated_indices_accumulate():
    torch.manual_seed(0)
    index = torch.tensor([0, 2, 2, 4, 0, 1])  # repeats add up
    traced = _close(lambda x, i, s: x.index_add(0, i, s), torch.randn(5, 3), index, torch.randn(6, 3))
    dot = next(op for op in traced.graph.ops if op.opcode == "dot")
    assert dot.dtype.value == "fp32"  # the one-hot matmul: values are never rounded
    _close(lambda x, i, s: x.index_add(1, i, s, alpha=0.5), torch.randn(2, 4, 3),
           torch.tensor([3, 3, 0]), torch.randn(2, 3, 3))

    def put(x, i, v):  # x[i] += v with repeats: index_put(accumulate=True)
        return x.index_put((i,), v, accumulate=True)

    _close(put, torch.randn(6, 2), torch.tensor([1, 1, 5, -1]), torch.randn(4, 2))


def test_index_add_bf16_model_is_not_rounded_by_autocast():
    torch.manual_seed(0)
    x, index, src = torch.randn(5, 3), torch.tensor([0, 2, 2, 4]), torch.randn(4, 3)
    fn = lambda x, i, s: x.index_add(0, i, s)  # noqa: E731
    traced = nc.trace(fn, (x, index, src), dtype="bf16")
    torch.testing.assert_close(traced(x, index, src), fn(x, index, src), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    torch.manual_seed(0)
    index = torch.tensor([[0, 2, 2, 5], [1, 1, 4, 1]])  # positions 3 (row 0) and 0 (row 1): untouched
    _close(lambda x, i, s: x.scatter_reduce(1, i, s, reduce=reduce, include_self=include_self),
           torch.randn(2, 6), index, torch.randn(2, 5))


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter:UserWarning")
def test_scatter_add_and_reduce_add():
    torch.manual_seed(0)
    index = torch.tensor([[0, 1], [0, 0], [2, 1]])
    _close(lambda x, i, s: x.scatter_add(0, i, s), torch.randn(3, 2), index, torch.randn(3, 2))
    _close(lambda x, i, s: x.scatter(0, i, s, reduce="add"), torch.randn(3, 2), index,
           torch.randn(3, 2))
    counts = lambda i: torch.zeros(4, dtype=torch.int64).scatter_add(  # noqa: E731
        0, i, torch.ones_like(i))
    _same(counts, torch.tensor([3, 0, 3, 3, 1]))  # integer counts (a bincount)


def test_scatter_reduce_prod_is_listed():
    fn = lambda x, i, s: x.scatter_reduce(0, i, s, reduce="prod")  # noqa: E731
    missing = nc.check(fn, (torch.randn(3), torch.tensor([0, 0]), torch.randn(2)))
    assert [m.opcode for m in missing] == ["aten.scatter_reduce"]
    assert "test_torch_scatter.py" in missing[0].source


def test_writes_at_several_index_tensors_and_under_a_boolean_mask():
    """wav2vec2 (and HuBERT, WavLM, every speech model sharing its feature mask) called with an
    ``attention_mask``: ``mask[(arange(batch), lengths - 1)] = 1`` (``index_put`` with two index
    tensors), ``mask.flip(-1).cumsum(-1).flip(-1)`` and ``hidden[~mask] = 0`` (a boolean mask)
    were three unsupported ops."""

    def feature_mask(x, lengths):
        m = torch.zeros(x.shape[0], x.shape[1], dtype=torch.long)
        m[(torch.arange(x.shape[0]), lengths - 1)] = 1
        return m.flip([-1]).cumsum(-1).flip([-1]).bool()

    def zero_padding(x, lengths):
        y = x.clone()
        y[~feature_mask(x, lengths).unsqueeze(-1).repeat(1, 1, x.shape[2])] = 0
        return y

    def grid_writes(x, rows, cols, v):
        y = x.clone()
        y[rows, cols] = v                    # index tensors broadcast against each other
        y[:, rows[0], cols[0]] = 2.0         # adjacent dims after a whole one
        y.index_put_((rows[:, 0], cols[0, :1]), torch.ones(3, 5), accumulate=True)  # repeats add up
        y[-1, -2] = 7.0
        return y

    def masked(x, keep):
        y = x.clone()
        y[keep] = -1.0
        y.index_put_((~keep,), torch.tensor(0.5), accumulate=True)
        return y

    torch.manual_seed(0)
    x, lengths = torch.randn(3, 7, 5), torch.tensor([7, 3, 5])
    _same(feature_mask, x, lengths)
    _same(zero_padding, x, lengths)
    _same(lambda x: x.flip([0, 2]), x)
    _same(grid_writes, torch.randn(4, 6, 5), torch.tensor([[0], [3], [0]]), torch.tensor([[1, -2]]),
          torch.randn(3, 2, 5))
    _same(masked, x, torch.rand(3, 7) > 0.5)
    # a 1-D mask was read as positions 0 and 1 (written at rows 0/1, not the masked rows: 1.9 off)
    _same(masked, torch.randn(6, 3), torch.tensor([False, True, False, False, True, True]))


def test_flip_along_several_dims_leading_and_trailing():
    """``torch.flip`` over the first and last dims at once, and a dim of size 1 (nothing to
    reverse): the same rows gather JAX's ``reverse`` uses (``frontends.flip``)."""
    torch.manual_seed(0)
    _same(lambda x: torch.flip(x, dims=(0, -1)) * 2 + x.flip(1), torch.randn(3, 4, 5))
    _same(lambda x: torch.flip(x, dims=(1, 2)), torch.randn(2, 1, 6))
