"""ATen ops the core has no single form for, written as compositions of core ATen ops the frontend
lowers already (``nn.EmbeddingBag``, ``nn.Bilinear``), used in both paths so one function defines each:

* inference: added to the export's decomposition table (``torch_frontend._decompositions``);
* training: the joint graph replays the forward's node as the composition
  (``torch_joint._replay_composites``), above autograd, so autograd differentiates the core ops
  (the ops' own ``*_backward`` kernels, which no decomposition table covers, never appear).

``_embedding_bag`` (``nn.EmbeddingBag``, ``F.embedding_bag``): the rows are one gather of the
table at the indices; bag ``b`` holds positions ``offsets[b] <= i < offsets[b + 1]`` (the last bag
runs to the end, or to the last offset with ``include_last_offset``), a ``[bags, n]`` membership
mask compared from the offsets at run time (no data-dependent shape); ``sum`` and ``mean`` are one
Tensor-engine matmul of the mask with the rows (``mean`` divided by the bag's size), ``max`` a
select and a max over the bag's positions on Vector. An empty bag gives zeros and ``padding_idx``
entries count for nothing, as torch's kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def embedding_bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                  scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                  per_sample_weights: torch.Tensor | None = None, include_last_offset: bool = False,
                  padding_idx: int | None = -1) -> tuple[torch.Tensor, ...]:
    """``aten._embedding_bag`` / ``aten.embedding_bag``: ``(output, offset2bag, bag_size,
    max_indices)`` as torch returns them (the last three only the ATen backward reads; computed
    for their shapes and values)."""
    padding_idx = -1 if padding_idx is None else padding_idx
    ids = indices.reshape(-1)
    n = ids.shape[0]
    offsets = offsets.to(ids.dtype)
    starts = offsets[:-1] if include_last_offset else offsets
    ends = offsets[1:] if include_last_offset else torch.cat([offsets[1:], offsets.new_full((1,), n)])
    position = torch.arange(n, device=ids.device, dtype=ids.dtype)
    member = (position.unsqueeze(0) >= starts.unsqueeze(1)) & (position.unsqueeze(0) < ends.unsqueeze(1))
    if padding_idx >= 0:
        member = member & (ids != padding_idx).unsqueeze(0)
    rows = aten.embedding(weight, ids)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1).to(rows.dtype)
    bag_size = member.sum(1)
    offset2bag = (position.unsqueeze(0) >= starts.unsqueeze(1)).sum(0) - 1
    if mode == 2:
        picked = torch.where(member.unsqueeze(2), rows.unsqueeze(0), float("-inf"))
        best = picked.amax(1)
        filled = (bag_size > 0).unsqueeze(1)
        output = torch.where(filled, best, torch.zeros_like(best))
        at_best = member.unsqueeze(2) & (picked == best.unsqueeze(1))
        first = torch.where(at_best, ids.view(1, -1, 1), weight.shape[0]).amin(1)
        max_indices = torch.where(filled, first, torch.full_like(first, -1))
    else:
        output = member.to(rows.dtype) @ rows
        if mode == 1:
            output = output / bag_size.clamp(min=1).unsqueeze(1).to(rows.dtype)
        max_indices = bag_size
    if mode == 0:
        offset2bag = ids.new_zeros(0)
    return output, offset2bag, bag_size, max_indices


def trilinear(i1: torch.Tensor, i2: torch.Tensor, i3: torch.Tensor, expand1: list[int],
              expand2: list[int], expand3: list[int], sumdim: list[int],
              unroll_dim: int = 1) -> torch.Tensor:
    """``aten._trilinear`` (``nn.Bilinear``, ``F.bilinear``): each input unsqueezed at its
    ``expand`` dims, the three multiplied and summed over ``sumdim``. The bilinear form torch calls
    (``x1 [B, I]``, ``W [O, I, J]``, ``x2 [B, J]``) is one Tensor-engine matmul ``x1 @ W`` (``[B, O *
    J]``), then a product with ``x2`` and a sum over ``J`` on Vector; any other form multiplies the
    broadcast inputs and sums."""
    if (list(expand1), list(expand2), list(expand3), list(sumdim)) == ([1, 3], [0], [1, 2], [2, 3]) \
            and i1.dim() == 2 and i2.dim() == 3 and i3.dim() == 2:
        out_features, inner, second = i2.shape
        mixed = i1 @ i2.permute(1, 0, 2).reshape(inner, out_features * second)
        return (mixed.reshape(-1, out_features, second) * i3.unsqueeze(1)).sum(-1)
    rank = i1.dim() + len(expand1)

    def expanded(t: torch.Tensor, dims: list[int]) -> torch.Tensor:
        for d in sorted(dims):
            t = t.unsqueeze(d)
        return t

    product = expanded(i1, expand1) * expanded(i2, expand2) * expanded(i3, expand3)
    return product.sum(list(sumdim)) if sumdim else product.reshape(product.shape[:rank])


def bilinear(input1: torch.Tensor, input2: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """``aten.bilinear`` (the training graph keeps it whole): the leading dims flattened, as
    ATen's ``bilinear`` does, then :func:`trilinear`'s bilinear form and the bias."""
    lead = input1.shape[:-1]
    out = trilinear(input1.reshape(-1, input1.shape[-1]), weight, input2.reshape(-1, input2.shape[-1]),
                    [1, 3], [0], [1, 2], [2, 3])
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, weight.shape[0])


COMPOSITES: dict[Any, Callable[..., Any]] = {
    aten._trilinear.default: trilinear,
    aten.bilinear.default: bilinear,
    aten._embedding_bag.default: embedding_bag,
    aten.embedding_bag.default: embedding_bag,
    aten.embedding_bag.padding_idx: embedding_bag,
    aten._embedding_bag_forward_only.default: embedding_bag,
}
"""ATen op overload -> its composition of core ATen ops."""


__all__ = ["COMPOSITES", "bilinear", "embedding_bag", "trilinear"]
