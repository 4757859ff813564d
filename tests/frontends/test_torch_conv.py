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


def _convolutions(traced):
    return [op for op in traced.graph.ops if op.opcode == "convolution"]


@pytest.mark.parametrize("options", [
    dict(kernel_size=3, padding=1),
    dict(kernel_size=3, stride=2, padding=1, bias=False),
    dict(kernel_size=(3, 2), stride=(1, 2), padding=(2, 0), dilation=(2, 1)),
    dict(kernel_size=1),                       # 1x1: one kernel offset, the tile itself
    dict(kernel_size=1, stride=2),             # ResNet's downsampling shortcut
    dict(kernel_size=7, stride=2, padding=3),  # ResNet's stem
])
def test_conv2d(options):
    torch.manual_seed(0)
    traced = _same(nn.Conv2d(4, 6, **options), torch.randn(2, 4, 9, 8))
    # implicit GEMM: the whole convolution is one op, no im2col slices, no matmul in the graph
    assert len(_convolutions(traced)) == 1
    assert not {"slice", "dot", "concatenate"} & {op.opcode for op in traced.graph.ops}


def test_patch_embedding_is_one_matmul():
    torch.manual_seed(0)
    traced = _same(nn.Conv2d(4, 6, kernel_size=4, stride=4), torch.randn(2, 4, 9, 8))
    assert [op.opcode for op in traced.graph.ops].count("dot") == 1  # ViT's patches: no slices
    assert not _convolutions(traced)


@pytest.mark.parametrize("module, shape", [
    (nn.Conv2d(4, 8, 3, padding=1, groups=2), (1, 4, 6, 6)),
    (nn.Conv2d(6, 6, 3, padding=1, groups=6), (2, 6, 5, 5)),            # depthwise
    (nn.Conv2d(192, 192, 3, padding=1, groups=192), (1, 192, 5, 5)),    # depthwise, 2 tiles
    (nn.Conv2d(160, 96, 3, stride=2, padding=1, groups=2), (2, 160, 7, 6)),  # groups across tiles
    (nn.Conv2d(200, 136, 3, padding=2, dilation=2), (1, 200, 6, 6)),    # > 128 in and out
    (nn.Conv2d(32, 16, 3, padding=1), (5, 32, 4, 4)),                   # packed images
])
def test_grouped_depthwise_and_tiled_conv(module, shape):
    torch.manual_seed(0)
    traced = _same(module, torch.randn(*shape), rtol=2e-4, atol=5e-5)
    (conv,) = _convolutions(traced)
    if module.groups == module.in_channels and module.groups > 1:
        # as many channels per block-diagonal stationary as divide the groups and fit 128
        assert conv.attrs["group_block"] == {6: 6, 192: 96}[module.groups]


def test_conv1d_and_conv3d():
    torch.manual_seed(0)
    _same(nn.Conv1d(3, 5, 3, stride=2, padding=2, dilation=2), torch.randn(2, 3, 11))
    traced = _same(nn.Conv3d(3, 4, (2, 3, 3), stride=(1, 2, 1), padding=1), torch.randn(1, 3, 4, 6, 5))
    assert len(_convolutions(traced)) == 1


def test_conv_network_bf16_stays_within_twice_torch_error():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 7, stride=2, padding=3), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.MaxPool2d(3, stride=2, padding=1), nn.Conv2d(16, 16, 3, padding=1,
                                                                        groups=16),
                        nn.Conv2d(16, 24, 1)).eval()
    x = torch.randn(2, 3, 20, 20)
    with torch.no_grad():
        want = net(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            framework = (net(x).float() - want).abs().max().item()
    ours = (nc.trace(net, (x,), dtype="bf16")(x) - want).abs().max().item()
    assert 0 < ours <= 2 * framework, (ours, framework)


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


def test_average_pools_that_leave_the_padding_out_of_the_count():
    """``count_include_pad=False`` (PoolFormer's token mixer: ``AvgPool2d(3, 1, 1,
    count_include_pad=False)`` minus its input) divides each window by the inputs it covers; it
    was listed as unsupported."""
    x = torch.randn(2, 4, 9, 7)
    _same(nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False), x)
    _same(nn.AvgPool2d((3, 5), stride=(2, 3), padding=(1, 2), count_include_pad=False), x)
    _same(nn.AvgPool1d(4, stride=2, padding=2, count_include_pad=False), x[:, :, 0])
    two = nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False),
                        nn.AvgPool2d(5, stride=1, padding=2, count_include_pad=False))
    _same(two, x)  # two divisor maps of one shape in one program: each its own weight
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.PoolFormerModel(transformers.PoolFormerConfig(
        num_encoder_blocks=2, depths=[1, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
        padding=[2, 1], pool_size=3)).eval()
    pixels = torch.randn(2, 3, 32, 32)
    got = nc.trace(model, {"pixel_values": pixels})(pixel_values=pixels)[0]
    torch.testing.assert_close(got, model(pixel_values=pixels).last_hidden_state, rtol=1e-4, atol=1e-5)


class _TwoResizesOneLayer(nn.Module):
    """Two resizes and two norms without weights in one module's forward (a decode head resizing
    each stage's features): their constants are weights of one layer."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = nn.functional.interpolate(x, size=(12, 10), mode="bilinear", align_corners=False)
        b = nn.functional.interpolate(y, size=(12, 10), mode="bilinear", align_corners=True)
        rows = nn.functional.layer_norm(a, (10,)).pow(2).sum(-1)  # [1, 2, 12]
        planes = nn.functional.layer_norm(b, (12, 10)).pow(2).sum((-2, -1))  # [1, 2]
        return a + b + (rows + planes[..., None])[..., None]


def test_constants_of_one_layer_are_weights_of_their_own():
    """Weights of one label share one HBM tensor (a tied weight); the interpolation matrices and a
    weightless layer norm's ones were labelled by layer alone, so a second resize in the same
    module read the first one's matrix: silently wrong (2.3 off), no error."""
    _same(_TwoResizesOneLayer(), torch.randn(1, 2, 6, 5), torch.randn(1, 2, 4, 3))


class _PoolIndices(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values, indices = nn.functional.max_pool2d(x, 2, return_indices=True)
        return values + indices


def test_unsupported_pool_mode_is_listed():
    missing = nc.check(_PoolIndices(), (torch.randn(1, 2, 8, 8),))
    assert [m.opcode for m in missing] == ["aten.max_pool2d_with_indices"]


@pytest.mark.parametrize("module, shape", [
    (nn.MaxPool2d(3, stride=2, ceil_mode=True), (1, 2, 8, 8)),             # one more window per dim
    (nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True), (2, 3, 8, 7)),  # that window would start
    (nn.MaxPool1d(2, ceil_mode=True), (1, 3, 9)),                          # in the padding: dropped
    (nn.AvgPool2d(3, stride=2, ceil_mode=True), (1, 2, 8, 8)),             # last window: 2 of 3 wide
    (nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True), (1, 2, 8, 8)),
    (nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False), (1, 2, 5, 7)),
    (nn.AvgPool1d(3, stride=2, padding=1, ceil_mode=True), (1, 2, 8)),
    (nn.AvgPool2d(1280, ceil_mode=True), (2, 5, 7, 7)),                    # EfficientNet's pooler
    (nn.MaxPool2d(9, ceil_mode=True), (1, 4, 3, 2)),
])
def test_ceil_mode_pools_match_torch(module, shape):
    """``ceil_mode=True`` (EfficientNet's pooler, ``AvgPool2d(hidden_dim, ceil_mode=True)`` over
    its 7x7 map, and many Caffe-era nets' max pools) was listed as unsupported: each window past
    the input's end reads the border value, an average divides by what torch counts."""
    torch.manual_seed(0)
    traced = _same(module, torch.randn(*shape))
    if module.kernel_size in (9, 1280):  # one window covering the input: a plain reduction
        assert "reduce-window" not in {op.opcode for op in traced.graph.ops}


@pytest.mark.parametrize("options", [
    dict(kernel_size=3, stride=2, padding=1, output_padding=1),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=(0, 1), dilation=(1, 2)),
    dict(kernel_size=4, stride=2, padding=3, bias=False),  # padding = dilation*(k-1): no border
    dict(kernel_size=3, stride=2, padding=3),  # padding > dilation*(k-1): a crop
    dict(kernel_size=3, stride=2, padding=1, groups=2),
    dict(kernel_size=2, stride=2),  # a learned 2x upsampling: one matmul, no zeros inserted
])
def test_conv_transpose2d(options):
    torch.manual_seed(0)
    traced = _same(nn.ConvTranspose2d(4, 6, **options), torch.randn(2, 4, 5, 4))
    dots = [op for op in traced.graph.ops if op.opcode == "dot"]
    if options["kernel_size"] == options["stride"]:
        assert len(dots) == 1  # a learned upsampling: one matmul, columns moved into place
        assert "slice" not in {op.opcode for op in traced.graph.ops}
    elif options["padding"] == 3 and options["kernel_size"] == 3:
        assert len(dots) == 1  # a crop: im2col of the spread input
    else:
        # the zeros between pixels are the convolution's input dilation: placed on chip
        (conv,) = _convolutions(traced)
        stride = options["stride"]
        assert conv.attrs["lhs_dilation"] == (tuple(stride) if isinstance(stride, tuple)
                                              else (stride, stride))


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


@pytest.mark.parametrize("options", [
    dict(size=(9, 7), align_corners=False),    # ViT's interpolate_pos_encoding: a given size
    dict(scale_factor=2, align_corners=True),
    dict(size=(4, 3), align_corners=False),    # downsampling: border taps clamped into the input
    dict(scale_factor=(2.2, 1.5), align_corners=False),
])
def test_bicubic_upsampling(options):
    """Bicubic resizes were decomposed by core ATen into gathers at computed indices (aten.index,
    unsupported): ViT with interpolate_pos_encoding=True stopped there. Four taps per output row,
    the same separable matmuls as bilinear."""
    torch.manual_seed(0)
    traced = _same(nn.Upsample(mode="bicubic", **options), torch.randn(2, 3, 6, 5))
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


class _Unfold(torch.nn.Module):
    def forward(self, x):
        nn_f = torch.nn.functional
        return (nn_f.unfold(x, kernel_size=3, padding=1),
                nn_f.unfold(x, (2, 3), dilation=(1, 2), stride=(2, 1), padding=(0, 2)),
                nn_f.unfold(x[0], 2, stride=2),  # unbatched [C, H, W]
                nn_f.fold(nn_f.unfold(x, 2, stride=2), x.shape[-2:], 2, stride=2))


def test_unfold_is_the_convolutions_im2col_not_gathers():
    """``F.unfold`` (im2col) gives torch's patches, channel-major rows, for padding, dilation,
    stride and an unbatched input; before it was core ATen's gathers at computed 2-D indices,
    listed as unsupported ``aten.index`` (ConvBERT, test_hf_user_trials)."""
    x = torch.randn(2, 3, 6, 8)
    assert nc.check(_Unfold(), (x,)) == []
    traced = nc.trace(_Unfold(), (x,))
    for got, want in zip(traced(x), _Unfold()(x)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("norm", [{"affine": True}, {}, {"affine": True, "track_running_stats": True}])
def test_instance_norm_matches_torch(norm: dict) -> None:
    """``nn.InstanceNorm2d`` (``_native_batch_norm_legit`` without running statistics: each image's
    channel normalised as a batch of one; unsupported before) in a conv net, as torch computes it
    (with ``track_running_stats`` an eval model uses its running statistics instead)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.InstanceNorm2d(8, **norm),
                                torch.nn.ReLU(), torch.nn.Conv2d(8, 2, 1)).eval()
    x = torch.randn(2, 3, 6, 6)
    assert not nc.check(model, (x,))
    torch.testing.assert_close(nc.trace(model, (x,))(x), model(x).detach(), rtol=1e-5, atol=1e-5)
