"""Training steps through layers that were listed as unsupported (tests/frontends/
test_torch_layer_coverage.py has their forwards): the loss and the parameters after plain SGD steps
(a parameter's change is its gradient times the rate) as PyTorch's own, and each layer's gradient
reaches the parameters before it (a zero gradient would leave them as they were: session 11's
``adaptive_avg_pool1d``)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import neuroncore


class _ConvThen(torch.nn.Module):
    """A convolution, then ``fn`` on its output, then a linear head: the convolution's gradient
    passes through ``fn``'s backward."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], features: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fn = fn
        self.head = torch.nn.Linear(features, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fn(self.conv(x)).flatten(1))


def _same_steps(model: torch.nn.Module, x: torch.Tensor, steps: int = 2, atol: float = 1e-6) -> None:
    ref, start = copy.deepcopy(model), copy.deepcopy(model)
    target = torch.randn(x.shape[0], 2, generator=torch.Generator().manual_seed(3))
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.05), torch.optim.SGD(ref.parameters(), lr=0.05)
    step = neuroncore.trace_train_step(model, opt, (x, target), loss_fn=F.mse_loss)
    for _ in range(steps):
        loss = F.mse_loss(ref(x), target)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert float(step(x, target)) == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
    moved = (ref.conv.weight - start.conv.weight).abs().max().item()
    assert moved > 1e-4, f"the convolution before the layer did not train ({moved})"
    for (name, p), (_, q) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.allclose(p, q, atol=atol, rtol=1e-6), f"{name}: max diff {(p - q).abs().max()}"


LAYERS = {
    # name: (fn on the [2, 4, 10, 9] convolution output, flattened features)
    "reflection_pad2d": (lambda y: F.pad(y, (2, 3, 1, 2), mode="reflect"), 4 * 13 * 14),
    "replication_pad2d": (lambda y: F.pad(y, (2, 3, 1, 2), mode="replicate"), 4 * 13 * 14),
    "reflection_pad1d": (lambda y: F.pad(y.flatten(2), (2, 3), mode="reflect"), 4 * 95),
    "replication_pad1d": (lambda y: F.pad(y.flatten(2), (2, 3), mode="replicate"), 4 * 95),
    "nearest_exact": (lambda y: F.interpolate(y, size=(7, 13), mode="nearest-exact"), 4 * 7 * 13),
    "nearest_by_1.5": (lambda y: F.interpolate(y, scale_factor=1.5, mode="nearest"), 4 * 15 * 13),
    "adaptive_max_pool2d": (lambda y: F.adaptive_max_pool2d(y, (4, 3)), 4 * 12),
    "adaptive_max_pool1d": (lambda y: F.adaptive_max_pool1d(y.flatten(2), 7), 4 * 7),
    "adaptive_avg_pool2d_uneven": (lambda y: F.adaptive_avg_pool2d(y, (4, 4)), 4 * 16),
    "adaptive_avg_pool2d_even": (lambda y: F.adaptive_avg_pool2d(y, (5, 3)), 4 * 15),
    "adaptive_avg_pool1d_uneven": (lambda y: F.adaptive_avg_pool1d(y.flatten(2), 7), 4 * 7),
    "median_dim": (lambda y: y.median(-1).values, 4 * 10),
    "median_whole": (lambda y: y * y.median(), 4 * 10 * 9),
    "cumprod": (lambda y: torch.cumprod(y * 0.5, -1), 4 * 10 * 9),
    "logcumsumexp": (lambda y: torch.logcumsumexp(y, 2), 4 * 10 * 9),
    "atan2": (lambda y: torch.atan2(y, y.flip(-1) + 0.5), 4 * 10 * 9),
    "hypot": (lambda y: torch.hypot(y, y.flip(-1) + 0.5), 4 * 10 * 9),
    "erfinv": (lambda y: torch.erfinv(torch.tanh(y) * 0.9), 4 * 10 * 9),
    "max_pool3d": (lambda y: F.max_pool3d(y.unsqueeze(1), 2), 2 * 5 * 4),
    "avg_pool3d": (lambda y: F.avg_pool3d(y.unsqueeze(1), (2, 3, 2), stride=(1, 2, 2)), 3 * 4 * 4),
    "avg_pool2d": (lambda y: F.avg_pool2d(y, 3, stride=2, padding=1), 4 * 5 * 5),
    "avg_pool2d_ceil_no_pad_count": (lambda y: F.avg_pool2d(y, 3, stride=2, padding=1, ceil_mode=True,
                                                            count_include_pad=False), 4 * 6 * 5),
    "avg_pool1d": (lambda y: F.avg_pool1d(y.flatten(2), 4, stride=3), 4 * 29),
    "local_response_norm": (lambda y: F.local_response_norm(y, 3), 4 * 10 * 9),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_trains_as_pytorch(name: str) -> None:
    torch.manual_seed(0)
    fn, features = LAYERS[name]
    x = torch.randn(2, 3, 10, 9, generator=torch.Generator().manual_seed(2))
    # logcumsumexp's outputs (~5) come from a log-step scan, torch's from a sequential one: the
    # head's gradient (those outputs times the error) differs by a few FP32 roundings of them
    _same_steps(_ConvThen(fn, features), x, atol=5e-6 if name == "logcumsumexp" else 1e-6)


class _BagClassifier(torch.nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(12, 6, mode=mode)
        self.head = torch.nn.Linear(6, 2)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(ids, offsets))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_trains_as_pytorch(mode: str) -> None:
    """The table's gradient through ``torch_composites.embedding_bag`` (autograd differentiates
    the composition: ``_embedding_bag_backward`` has no decomposition)."""
    torch.manual_seed(0)
    model = _BagClassifier(mode)
    ref, start = copy.deepcopy(model), copy.deepcopy(model)
    ids, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 11]), torch.tensor([0, 4, 4, 7])
    target = torch.randn(4, 2, generator=torch.Generator().manual_seed(3))
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.5), torch.optim.SGD(ref.parameters(), lr=0.5)
    step = neuroncore.trace_train_step(model, opt, (ids, offsets, target), loss_fn=F.mse_loss)
    for _ in range(2):
        loss = F.mse_loss(ref(ids, offsets), target)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert float(step(ids, offsets, target)) == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
    assert (ref.bag.weight - start.bag.weight).abs().max().item() > 1e-3
    for (name, p), (_, q) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=0), f"{name}: max diff {(p - q).abs().max()}"


class _BilinearHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.left = torch.nn.Linear(5, 5)
        self.bilinear = torch.nn.Bilinear(5, 6, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.bilinear(torch.tanh(self.left(x)), y)


def test_bilinear_layer_trains_as_pytorch() -> None:
    """``nn.Bilinear`` replayed as ``torch_composites.bilinear`` in the step's forward: its weight,
    bias and the linear before it train as PyTorch."""
    torch.manual_seed(0)
    model = _BilinearHead()
    ref, start = copy.deepcopy(model), copy.deepcopy(model)
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(6, 5, generator=g), torch.randn(6, 6, generator=g)
    target = torch.randn(6, 2, generator=g)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    step = neuroncore.trace_train_step(model, opt, (x, y, target), loss_fn=F.mse_loss)
    for _ in range(2):
        loss = F.mse_loss(ref(x, y), target)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert float(step(x, y, target)) == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
    assert (ref.left.weight - start.left.weight).abs().max().item() > 1e-3
    for (name, p), (_, q) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-6), f"{name}: max diff {(p - q).abs().max()}"
