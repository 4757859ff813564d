"""Image groups (neuroncore/compiler/image_groups.py): a batched convolution network's leading blocks
lowered a few images at a time, exact against torch and against the whole-batch program."""

from __future__ import annotations

import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import neuroncore as nc  # noqa: E402
from neuroncore.hardware import core_spec  # noqa: E402

groups_module = sys.modules["neuroncore.compiler.image_groups"]


class _Block(nn.Module):
    """relu(bn(conv(relu(bn(conv(x))))) + x): a ResNet basic block."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + x)


def _net(blocks: int = 3) -> nn.Module:
    """A stem, ``blocks`` residual blocks of 128 channels at full resolution, then a stride-2
    convolution, global pooling and a classifier: at 80 x 80 pixels a block value is 25 KB per
    partition and image in FP32, so four images (100 KB) are over half of SBUF."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 128, 3, padding=1, bias=False), nn.BatchNorm2d(128), nn.ReLU(),
        *[_Block(128) for _ in range(blocks)],
        nn.Conv2d(128, 128, 1, stride=2, bias=False), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2)
    return net.eval()


def _trace(net, x):
    return nc.trace(net, (x,), instance="inf2.xlarge")


def _grouped_ops(program):
    return [op for op in program.graph.ops if ".images" in op.name]


def _one_image_through_the_prefix(graph, spec):
    """A plan that steps the whole per-image prefix one image at a time: up to its last position
    whose frontier is one value."""
    if groups_module._batch(graph) < 2:
        return None  # as the program's own plan: one image is a group already
    prefix = groups_module._Plan(graph, groups_module._batch(graph))
    end = max(i for i, f in enumerate(prefix.frontiers) if f is not None and len(f) == 1)
    return groups_module.Decision(1, end + 1, 0)


@pytest.mark.parametrize("batch", [1, 2])
def test_a_conv_net_stepped_image_by_image_matches_torch(batch, monkeypatch):
    """Batch 2 is stepped one image at a time by a forced plan (the program's own leaves it whole:
    its values fit); batch 1 is never rewritten."""
    net = _net()
    x = torch.randn(batch, 3, 80, 80)
    monkeypatch.setattr(groups_module, "plan", _one_image_through_the_prefix)
    traced = _trace(net, x)
    with torch.no_grad():
        want = net(x)
    torch.testing.assert_close(traced(x), want, rtol=2e-4, atol=5e-5)
    convs = [op for op in _grouped_ops(traced.program) if op.opcode == "convolution"]
    assert len(convs) == (0 if batch == 1 else 2 * 8)


def test_batch_4_is_stepped_image_by_image_bit_identical_and_keeps_block_values_on_chip(monkeypatch):
    """At batch 4 a block value is over half of SBUF: the program's own plan steps the stem, the
    blocks and the stride-2 convolution one image at a time. The same values as torch, and as the
    whole-batch program element for element; the whole-batch program sends every block value to
    HBM scratch, the grouped one only the gathered last value."""
    net = _net()
    x = torch.randn(4, 3, 80, 80)
    grouped = _trace(net, x)
    monkeypatch.setattr(groups_module, "plan", lambda graph, spec: None)
    whole = _trace(net, x)
    convs = [op for op in _grouped_ops(grouped.program) if op.opcode == "convolution"]
    assert {op.shape[0] for op in convs} == {1}
    # per image: the stem, three blocks of two and the stride-2 convolution (its output, a
    # quarter the size, is the cheapest value to gather for the whole batch)
    assert len(convs) == 4 * 8
    concats = [op for op in grouped.program.graph.ops if op.opcode == "concatenate"]
    assert len(concats) == 1 and concats[0].shape[0] == 4
    assert not _grouped_ops(whole.program)
    out = grouped(x)
    with torch.no_grad():
        torch.testing.assert_close(out, net(x), rtol=2e-4, atol=5e-5)
    np.testing.assert_array_equal(out.numpy(), whole(x).numpy())

    def scratch(program):
        return program.hbm_bytes_by_kind()["scratch"]

    assert scratch(grouped.program) < scratch(whole.program) / 2
    grouped_ns = grouped.variants[0].model.execute(timing_only=True).device_time_ns
    whole_ns = whole.variants[0].model.execute(timing_only=True).device_time_ns
    assert grouped_ns < whole_ns


def test_plan_leaves_small_batches_and_nets_without_convolutions_alone():
    spec = core_spec("inf2")
    b = nc.GraphBuilder("mlp")
    x = b.parameter("x", (8, 128, 4096))
    assert groups_module.plan(b.build([b.tanh(x)]), spec) is None
    net = _net(1)
    for batch, expect in ((2, None), (8, 1)):
        traced = _trace(net, torch.randn(batch, 3, 80, 80))
        convs = [op for op in _grouped_ops(traced.program) if op.opcode == "convolution"]
        assert ({op.shape[0] for op in convs} or {None}) == {expect}
