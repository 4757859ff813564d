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


@pytest.mark.parametrize("options", [
    dict(kernel_size=3, stride=2, padding=1, output_padding=1),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=(0, 1), dilation=(1, 2)),
    dict(kernel_size=4, stride=2, padding=3, bias=False),  # padding > dilation*(k-1): a crop
    dict(kernel_size=3, stride=2, padding=1, groups=2),
    dict(kernel_size=2, stride=2),  # a learned 2x upsampling: one matmul, no zeros inserted
])
def test_conv_transpose2d(options):
    torch.manual_seed(0)
    traced = _same(nn.ConvTranspose2d(4, 6, **options), torch.randn(2, 4, 5, 4))
    dots = [op for op in traced.graph.ops if op.opcode == "dot"]
    assert len(dots) == 1
    if options["kernel_size"] == options["stride"]:
        assert "slice" not in {op.opcode for op in traced.graph.ops}


def test_conv_transpose1d_and_3d():
    torch.manual_seed(0)
    _same(nn.ConvTranspose1d(3, 2, 3, stride=3, padding=1), torch.randn(2, 3, 6))
    _same(nn.ConvTranspose3d(2, 3, 2, stride=2), torch.randn(1, 2, 3, 2, 2))


@pytest.mark.parametrize("options", [
    dict(scale_factor=2, align_corners=False),
    dict(scale_factor=2, align_corners=True),
    dict(size=(5, 13), align_corners=False),   # uneven factors
    dict(size=(3, 4), align_corners=True),     # downsampling
    dict(scale_factor=(1.5, 0.5), align_corners=False),
])
def test_bilinear_upsampling(options):
    torch.manual_seed(0)
    traced = _same(nn.Upsample(mode="bilinear", **options), torch.randn(2, 3, 6, 8))
    # separable: one constant interpolation matrix per spatial dim, contracted on the Tensor engine
    assert [op.opcode for op in traced.graph.ops].count("dot") == 2


def test_linear_and_trilinear_upsampling():
    torch.manual_seed(0)
    _same(nn.Upsample(scale_factor=3, mode="linear"), torch.randn(2, 3, 5))
    _same(nn.Upsample(size=(4, 6, 3), mode="trilinear", align_corners=True), torch.randn(1, 2, 2, 3, 3))


def test_bilinear_upsampling_bf16_is_not_auto_cast():
    """torch's autocast leaves resizes in fp32, so ``dtype="bf16"`` does too (only matmuls of the
    model are auto-cast)."""
    torch.manual_seed(0)
    module, x = nn.Upsample(size=(7, 9), mode="bilinear"), torch.randn(1, 2, 4, 5)
    traced = nc.trace(module, (x,), dtype="bf16")
    torch.testing.assert_close(traced(x), module(x), rtol=1e-5, atol=1e-6)
