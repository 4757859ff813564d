"""Layers and ops users hit that were listed as unsupported (docs/frontends.md, session 12's sweep
of ``torch.nn``), each lowered to engine instructions and compared with PyTorch: padding by
reflection / replication, ``nearest-exact`` resizes, adaptive pools with uneven windows,
``torch.median``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import neuroncore as nc  # noqa: E402


class _Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _same(module, *inputs, rtol=1e-5, atol=1e-6):
    """``module`` traced, no ``aten.*`` op left (nothing unsupported), and its outputs as torch's."""
    module.eval()
    assert nc.check(module, inputs) == []
    traced = nc.trace(module, inputs)
    with torch.no_grad():
        want = module(*inputs)
    got = traced(*inputs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
    return traced


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_reflection_and_replication_padding_match_torch(mode):
    """torch decomposes both into ``x[..., i, :]`` at computed positions, listed as an unsupported
    ``aten.index`` before; now one row gather at constant positions per padded dim."""
    torch.manual_seed(0)
    _same(_Fn(lambda x: F.pad(x, (2, 3), mode=mode)), torch.randn(2, 3, 10))
    _same(_Fn(lambda x: F.pad(x, (2, 3, 1, 2), mode=mode)), torch.randn(2, 3, 10, 9))
    layers = nn.Sequential(nn.ReflectionPad2d((1, 0, 2, 1)), nn.ReplicationPad2d(1), nn.Conv2d(3, 4, 3))
    _same(layers, torch.randn(2, 3, 7, 6))
    _same(nn.ReplicationPad1d((0, 4)), torch.randn(1, 2, 5))


@pytest.mark.parametrize("size", [(7, 13), (20, 4), (10, 9)])
def test_nearest_exact_resizes_match_torch(size):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 10, 9)
    _same(_Fn(lambda t: F.interpolate(t, size=size, mode="nearest-exact")), x)
    _same(_Fn(lambda t: F.interpolate(t, scale_factor=1.5, mode="nearest-exact")), torch.randn(1, 2, 7))
    # plain nearest by a non-integer factor: the same gather (a broadcast before, for integer ones)
    _same(_Fn(lambda t: F.interpolate(t, size=size, mode="nearest")), x)


@pytest.mark.parametrize("module, shape", [
    (nn.AdaptiveMaxPool2d((4, 3)), (2, 3, 10, 9)),   # uneven and overlapping windows
    (nn.AdaptiveMaxPool2d((5, 3)), (2, 3, 10, 9)),   # even: strided slices
    (nn.AdaptiveMaxPool2d(1), (1, 4, 5, 7)),
    (nn.AdaptiveMaxPool1d(4), (2, 3, 10)),
    (nn.AdaptiveMaxPool2d((7, 7)), (1, 2, 9, 11)),
    (nn.AdaptiveAvgPool2d((4, 4)), (2, 3, 10, 9)),   # uneven (listed as unsupported before)
    (nn.AdaptiveAvgPool2d((3, 7)), (1, 2, 9, 11)),
    (nn.AdaptiveAvgPool1d(4), (2, 3, 10)),
    (nn.AdaptiveAvgPool1d(7), (2, 3, 10)),
])
def test_adaptive_pools_with_uneven_windows_match_torch(module, shape):
    torch.manual_seed(0)
    _same(module, torch.randn(*shape))


def test_adaptive_pools_bf16_stay_within_twice_torch_error():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.AdaptiveMaxPool2d((4, 3)), nn.Conv2d(8, 8, 1),
                        nn.AdaptiveAvgPool2d((3, 2)), nn.Flatten(), nn.Linear(48, 5)).eval()
    x = torch.randn(2, 3, 10, 9)
    with torch.no_grad():
        want = net(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            framework = (net(x).float() - want).abs().max().item()
    ours = (nc.trace(net, (x,), dtype="bf16")(x) - want).abs().max().item()
    assert 0 < ours <= 2 * framework, (ours, framework)


def test_median_whole_and_along_a_dim_match_torch():
    """The lower median and its index (``rank_select``); a row with a NaN gives NaN at the first."""
    torch.manual_seed(0)
    x = torch.randn(3, 7, 6)
    _same(_Fn(lambda t: t.median()), x)
    _same(_Fn(lambda t: torch.median(t, dim=1)), x)
    _same(_Fn(lambda t: t.median(-1, keepdim=True)), x)
    _same(_Fn(lambda t: (t * 4).int().median(0).values), x)
    with_nan = x.clone()
    with_nan[1, 2, 3] = with_nan[1, 5, 3] = float("nan")
    module = _Fn(lambda t: torch.median(t, dim=1))
    values, indices = nc.trace(module, (with_nan,))(with_nan)
    want_values, want_indices = module(with_nan)
    torch.testing.assert_close(values, want_values, equal_nan=True)
    assert torch.equal(indices, want_indices)
    assert torch.isnan(nc.trace(_Fn(lambda t: t.median()), (with_nan,))(with_nan))


class _Bag(nn.Module):
    def __init__(self, **options) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(12, 5, **options)

    def forward(self, ids, offsets=None, weights=None):
        return self.bag(ids, offsets, per_sample_weights=weights)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_matches_torch(mode):
    """``nn.EmbeddingBag`` (``aten._embedding_bag``, unsupported before): a gather of the rows and a
    membership mask built from the offsets at run time; an empty bag gives zeros."""
    torch.manual_seed(0)
    ids = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 11])
    offsets = torch.tensor([0, 4, 4, 7])  # the second bag is empty
    _same(_Bag(mode=mode), ids, offsets)
    _same(_Bag(mode=mode), torch.randint(0, 12, (3, 4)))  # 2-D: fixed-size bags, no offsets
    _same(_Bag(mode=mode, padding_idx=2), ids, offsets)
    _same(_Bag(mode=mode, include_last_offset=True), ids, torch.tensor([0, 3, 3, 8, 10]))
    module = _Bag(mode=mode).eval()
    traced = nc.trace(module, (ids, offsets))
    other = torch.tensor([0, 1, 9, 10])  # other offsets, same program: the bags are found on the core
    with torch.no_grad():
        torch.testing.assert_close(traced(ids, other), module(ids, other))


def test_embedding_bag_per_sample_weights_match_torch():
    torch.manual_seed(0)
    ids, offsets = torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 2, 5])
    _same(_Bag(mode="sum"), ids, offsets, torch.rand(6))


def test_scans_match_torch():
    """``cumprod`` and ``logcumsumexp`` as log-step scans, as ``cumsum``."""
    torch.manual_seed(0)
    x = torch.randn(3, 37, 5)
    _same(_Fn(lambda t: torch.cumprod(t * 0.5 + 1.0, 1)), x)
    _same(_Fn(lambda t: torch.cumprod(t, -1)), x)
    _same(_Fn(lambda t: torch.logcumsumexp(t * 30.0, 1)), x, rtol=1e-5, atol=2e-5)
    _same(_Fn(lambda t: torch.logcumsumexp(t.masked_fill(t < 0, float("-inf")), -1)), x)


def test_special_functions_match_torch():
    torch.manual_seed(0)
    x, y = torch.randn(4, 300) * 3.0, torch.randn(4, 300) * 3.0
    x[0, :4] = torch.tensor([0.0, 0.0, -2.0, float("inf")])
    y[0, :4] = torch.tensor([0.0, -1.0, 0.0, float("inf")])
    _same(_Fn(torch.atan2), y, x)
    _same(_Fn(torch.hypot), y, x)
    _same(_Fn(lambda t: torch.atan2(t, torch.tensor(2.0)) + torch.hypot(t, torch.tensor(-1.5))), x)
    u = torch.linspace(-0.999999, 0.999999, 1203).reshape(3, 401)
    _same(_Fn(torch.erfinv), u, rtol=2e-5, atol=1e-6)
    ends = torch.tensor([-1.0, 1.0, 0.0, 0.5])
    _same(_Fn(torch.erfinv), ends)
    _same(nn.RReLU(0.1, 0.3), x)


def test_special_functions_bf16_stay_within_twice_torch_error():
    torch.manual_seed(0)
    net = _Fn(lambda a, b: torch.atan2(a, b) + torch.hypot(a, b) + torch.erfinv(torch.tanh(a) * 0.9))
    a, b = torch.randn(8, 64), torch.randn(8, 64)
    want = net(a, b)
    framework = (net(a.bfloat16(), b.bfloat16()).float() - want).abs().max().item()
    ours = (nc.trace(net, (a, b), dtype="bf16")(a, b) - want).abs().max().item()
    assert ours <= 2 * framework, (ours, framework)


@pytest.mark.parametrize("module, shape", [
    (nn.MaxPool3d(2), (1, 2, 6, 6, 6)),
    (nn.MaxPool3d((2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0)), (2, 3, 5, 7, 6)),
    (nn.AvgPool3d(2), (1, 2, 6, 6, 6)),
    (nn.AvgPool3d(3, stride=2, padding=1, count_include_pad=False), (1, 2, 5, 6, 7)),
    (nn.LocalResponseNorm(3), (2, 6, 5, 4)),       # AlexNet's: an average over channels (avg_pool3d)
    (nn.LocalResponseNorm(4, alpha=1e-3, beta=0.5, k=2.0), (2, 7, 5)),
])
def test_3d_pools_and_local_response_norm_match_torch(module, shape):
    torch.manual_seed(0)
    _same(module, torch.randn(*shape))


def test_bilinear_layer_matches_torch():
    """``nn.Bilinear`` (``aten._trilinear``, unsupported before): one matmul ``x1 @ W`` and a
    product-sum with ``x2`` (``torch_composites.trilinear``)."""
    torch.manual_seed(0)
    layer = nn.Bilinear(5, 6, 3)
    _same(layer, torch.randn(4, 5), torch.randn(4, 6))
    _same(layer, torch.randn(2, 3, 5), torch.randn(2, 3, 6))
    _same(nn.Bilinear(4, 4, 2, bias=False), torch.randn(3, 4), torch.randn(3, 4))
    x1, x2 = torch.randn(16, 5), torch.randn(16, 6)
    with torch.no_grad():
        want = layer(x1, x2)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            framework = (layer(x1, x2).float() - want).abs().max().item()
    ours = (nc.trace(layer, (x1, x2), dtype="bf16")(x1, x2) - want).abs().max().item()
    assert 0 < ours <= 2 * framework, (ours, framework)
