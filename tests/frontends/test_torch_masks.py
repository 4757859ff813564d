"""Mask-building and index ops (neuroncore/frontends/torch_masks.py) against torch, one by one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import neuroncore as nc  # noqa: E402


def _same(fn, *inputs):
    traced = nc.trace(fn, inputs)
    got, want = traced(*inputs), fn(*inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not [op for op in traced.graph.ops if op.opcode.startswith("aten.")]
    return traced


def test_any_all_over_dims_and_whole():
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]])
    _same(lambda m: torch.stack([m.bool().any(-1), m.bool().all(-1)]), mask)
    _same(lambda m: (m == 0).any(), mask)
    _same(lambda m: torch.all(m > -1, dim=0, keepdim=True), mask)


def test_cumsum_int_positions_and_float():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1, 1]])
    # RoBERTa's create_position_ids_from_input_ids
    _same(lambda m: (torch.cumsum(m, dim=1) * m) + 1, mask)
    _same(lambda x: torch.cumsum(x, 0), torch.randn(9, 3))


def test_argmax_argmin_first_occurrence():
    x = torch.tensor([[1.0, 5.0, 5.0, -2.0], [0.0, 0.0, 0.0, 0.0], [-1.0, -3.0, 7.0, -3.0]])
    _same(lambda t: torch.stack([t.argmax(-1), t.argmin(-1)]), x)
    _same(lambda t: t.argmax(), x)
    ids = torch.tensor([[5, 9, 2, 9], [1, 0, 0, 3]])
    _same(lambda t: t.argmax(dim=-1), ids)  # CLIP's eos position on int ids


def test_max_and_min_over_a_dim_give_their_indices_like_torch():
    """``values, idx = x.max(-1)`` (greedy decoding in a user's loop): the indices are the first
    position holding the extreme value, as torch documents for ties (before: ``aten.max``
    unsupported whenever the indices were read)."""
    x = torch.tensor([[1.0, 5.0, 5.0, -2.0], [0.0, 0.0, 0.0, 0.0], [-1.0, -3.0, 7.0, -3.0]])
    _same(lambda t: torch.stack(t.max(-1)[::-1]).float(), x)
    _same(lambda t: t.min(dim=0, keepdim=True).indices, x)
    _same(lambda t: t.max(dim=1).indices, torch.tensor([[5, 9, 2, 9], [1, 0, 0, 3]]))


def test_sign_like_torch():
    """``torch.sign`` / ``sgn``: -1, 0 or 1, and 0 for NaN as torch's CPU kernel gives (before:
    ``aten.sign`` unsupported; abs's and L1's backward read it)."""
    x = torch.tensor([[-2.5, 0.0, -0.0, 3.0], [float("nan"), float("-inf"), float("inf"), 1e-30]])
    _same(torch.sign, x)
    _same(lambda t: t.sgn() * t.abs(), x[:1])
    _same(torch.sign, torch.tensor([[-3, 0, 7]]))


def test_gather_and_runtime_index():
    x = torch.randn(3, 5, 4)
    index = torch.tensor([[0, 2, 4, 1], [4, 4, 0, 0], [1, 1, 1, 3]])[:, None, :].expand(3, 2, 4)
    _same(lambda t, i: torch.gather(t, 1, i), x, index.contiguous())
    hidden = torch.randn(2, 6, 8)
    ids = torch.tensor([[4, 1, 9, 2, 0, 0], [3, 9, 5, 7, 8, 1]])
    # CLIP's pooled output: hidden[arange(batch), ids.argmax(-1)]
    _same(lambda h, i: h[torch.arange(h.shape[0]), i.argmax(dim=-1)], hidden, ids)
    # negative runtime indices count from the end
    _same(lambda h, i: h[(i[:, 4] > 0).long() - 2], hidden, ids)



def test_gathered_values_divided_by_their_row_sum():
    # DeepSeek-V3's router: topk weights gathered from the scores, normalised by their row sum. The
    # gather's [rows*k, 1] column is aliased as the [rows, k] values, so the row sum's column cannot
    # be a per-partition operand of the division (the program read 32 partitions against 16)
    scores, index = torch.rand(16, 4), torch.randint(0, 4, (16, 2))

    def normalised(s: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        w = s.gather(1, i)
        return w / (w.sum(dim=-1, keepdim=True) + 1e-20) * 2.5

    _same(normalised, scores, index)

def test_topk_values_and_indices_like_torch():
    x = torch.tensor([[0.1, 0.7, 0.05, 0.7, 0.15], [3.0, -1.0, 2.0, 0.0, 1.0]])
    _same(lambda t: torch.topk(t, 2, dim=-1).values, x)
    _same(lambda t: torch.topk(t, 3, dim=-1).indices, x)  # ties: the first one first, as torch
    _same(lambda t: torch.topk(t, 2, dim=0, largest=False).indices, x)


def test_einsum_and_index_updates():
    q, k = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8)
    _same(lambda a, b: torch.einsum("bhqd,bhkd->bhqk", a, b), q, k)
    _same(lambda a, b: torch.einsum("bhqd,bhkd->bqk", a, b), q, k)


def test_rounded_division_remainder_and_fmod_like_torch():
    # Llama 4's chunked attention (q // chunk == k // chunk), DETR's floor-divided arange, x % window:
    # each was kept as NotImplemented and stopped the trace with "expected a tensor"
    ints = torch.arange(-10, 10).reshape(4, 5)
    floats = torch.linspace(-3.0, 3.0, 20).reshape(4, 5)
    _same(lambda x: torch.stack([x // 3, x % 5, torch.div(x, 4, rounding_mode="trunc"), torch.fmod(x, -3)]),
          ints)
    _same(lambda x: torch.remainder(x, x + 17) + x // (x - 20), ints)
    _same(lambda f: torch.stack([f // 0.7, f % 0.7, torch.fmod(f, 0.7),
                                 torch.div(f, 0.3, rounding_mode="trunc")]), floats)
    positions = torch.arange(12)[None]
    _same(lambda p: (p[:, :, None] // 4 == p[:, None, :] // 4).long(), positions)


def test_index_select_on_any_dim_with_runtime_and_constant_indices():
    # XLNet's relative shift selects along dim 3 (was listed as an unsupported aten.index_select)
    x, i = torch.randn(3, 5, 4), torch.tensor([4, 0, 2, 2])
    _same(lambda t, j: torch.index_select(t, 1, j), x, i)
    _same(lambda t, j: torch.index_select(t, 2, j[:3] % 4), x, i)
    _same(lambda t, j: torch.index_select(t, 0, j[:2] % 3), x, i)
    _same(lambda t: torch.index_select(t, -1, torch.arange(3)), x)


def test_reductions_over_a_128k_row_are_per_column_chunk_then_combined():
    """argmax, topk, sum and max over Llama 3's 128,256-wide rows on one core: wider than the engines'
    free-dim limit and than SBUF, reduced per column chunk then combined (before: 'cannot place
    reduce: reduces 128256 elements per partition')."""

    class Wide(torch.nn.Module):
        def forward(self, x):
            values, indices = torch.topk(x, 3, dim=-1)
            return values, indices, torch.argmax(x, -1), x.sum(-1), x.amax(-1)

    torch.manual_seed(0)
    x = torch.randn(2, 128256)
    x[0, 70] = x[0, 120000] = 9.0  # a tie in separate chunks: the first index wins, as torch's
    x[1, 127000] = 8.0  # the maximum in the last chunk
    got = nc.trace(Wide(), (x,))(x)
    want = Wide()(x)
    assert got[2].tolist() == [70, 127000] == want[2].tolist()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-3)


def test_isinf_isnan_isfinite_like_torch_in_every_float_type():
    """T5 in fp16 clamps its hidden states when ``torch.isinf(h).any()``: ``aten.isinf`` stopped a
    T5 encoder loaded in half precision (``.half()`` / ``torch_dtype=torch.float16``)."""
    x = torch.tensor([[1.0, -float("inf"), float("nan"), 65504.0], [float("inf"), 0.0, -2.5, 1e-30]])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        v = x.to(dtype)
        _same(lambda t: torch.stack([t.isinf(), t.isnan(), t.isfinite(), torch.isposinf(t),
                                     torch.isneginf(t)]), v)
        _same(lambda t: torch.where(torch.isinf(t).any(), torch.nan_to_num(t, posinf=7.0), t), v)


def test_t5_encoder_in_fp16_clamps_as_torch_does():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
                                   vocab_size=128)
    model = transformers.T5EncoderModel(config).eval().half()
    ids = torch.randint(0, 128, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, -3:] = 0
    traced = nc.trace(model, {"input_ids": ids, "attention_mask": mask})
    got = traced(input_ids=ids, attention_mask=mask)[0]
    want = model(input_ids=ids, attention_mask=mask).last_hidden_state
    exact = model.float()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert got.dtype == torch.float16
    # within 2x torch's own fp16 error against the same model in fp32
    assert (got.float() - exact).abs().max() <= 2 * (want.float() - exact).abs().max()


class _Sorts(torch.nn.Module):
    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, indices = torch.sort(x, -1)
        down, down_at = torch.sort(x, dim=0, descending=True, stable=True)
        probs, _ = torch.sort(torch.softmax(x, -1), -1, descending=True)
        nucleus = torch.cumsum(probs, -1) - probs < 0.8  # top-p sampling's kept mass
        return (values, indices, down, down_at, torch.argsort(x, -1, descending=True), nucleus,
                torch.sort(ids, dim=-1, stable=True)[1], torch.msort(x))


def test_sort_and_argsort_match_torch() -> None:
    """``torch.sort`` / ``argsort`` / ``msort`` (``aten.sort``, unsupported before) as a stable rank
    sort (rank_sort.py): values and int64 indices exact, ties in index order, either direction."""
    torch.manual_seed(0)
    x = torch.randn(3, 9)
    x[0, 3] = x[0, 5]
    x[1, :4] = 0.5
    ids = torch.randint(0, 4, (3, 9))
    model = _Sorts()
    assert not nc.check(model, (x, ids))
    for got, want in zip(nc.trace(model, (x, ids))(x, ids), model(x, ids)):
        assert got.dtype == want.dtype and torch.equal(got, want)
