"""Convolutions, pooling and norms (neuroncore/frontends/torch_conv.py) against torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import neuroncore as nc  # noqa: E402


def _same(module, *inputs, rtol=1e-4, atol=1e-5):
    module.eval()
    traced = nc.trace(module, inputs)
    with torch.no_grad():
        want = module(*inputs)
    got = traced(*inputs)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    assert not [op for op in traced.graph.ops if op.opcode.startswith("aten.")]
    return traced


@pytest.mark.parametrize("options", [
    dict(kernel_size=3, padding=1),
    dict(kernel_size=3, stride=2, padding=1, bias=False),
    dict(kernel_size=(3, 2), stride=(1, 2), padding=(2, 0), dilation=(2, 1)),
    dict(kernel_size=4, stride=4),            # ViT's patch embedding: no slices
    dict(kernel_size=1),                       # a 1x1 convolution is one matmul
])
def test_conv2d(options):
    torch.manual_seed(0)
    traced = _same(nn.Conv2d(4, 6, **options), torch.randn(2, 4, 9, 8))
    dots = [op for op in traced.graph.ops if op.opcode == "dot"]
    assert len(dots) == 1  # im2col: the whole convolution is one Tensor-engine matmul


def test_grouped_and_depthwise_conv():
    torch.manual_seed(0)
    _same(nn.Conv2d(4, 8, 3, padding=1, groups=2), torch.randn(1, 4, 6, 6))
    traced = _same(nn.Conv2d(6, 6, 3, padding=1, groups=6), torch.randn(2, 6, 5, 5))
    dot = next(op for op in traced.graph.ops if op.opcode == "dot")
    assert dot.shape[0] == 6  # one batched matmul, the groups as its batch


def test_conv1d():
    torch.manual_seed(0)
    _same(nn.Conv1d(3, 5, 3, stride=2, padding=2, dilation=2), torch.randn(2, 3, 11))


def test_pools_norms_upsampling():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, 8)
    _same(nn.MaxPool2d(3, stride=2, padding=1), x)
    _same(nn.AvgPool2d(2), x)
    _same(nn.AdaptiveAvgPool2d((1, 1)), x)
    _same(nn.AdaptiveAvgPool2d((2, 4)), x)
    bn = nn.BatchNorm2d(4)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.data.uniform_(0.5, 1.5)
    _same(bn, x)
    _same(nn.GroupNorm(2, 4), x)
    _same(nn.Upsample(scale_factor=2, mode="nearest"), x)


def test_unsupported_pool_mode_is_listed():
    missing = nc.check(nn.MaxPool2d(3, stride=2, ceil_mode=True), (torch.randn(1, 2, 8, 8),))
    assert [m.opcode for m in missing] == ["aten.max_pool2d_with_indices"]
