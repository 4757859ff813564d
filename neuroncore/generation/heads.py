"""A transformers causal LM with its attention heads laid out for ``tp`` ranks that do not divide them.

transformers-neuronx rewrites the attention weights when it shards a model whose KV heads ``tp`` does
not divide (``GQA.REPLICATED_HEADS``): KV heads are replicated, query heads padded with zero heads
(:mod:`neuroncore.parallel.heads` states the rule). This does the same to a copy of a transformers model
before it is traced: each attention module's ``q_proj`` / ``k_proj`` / ``v_proj`` rows and ``o_proj``
columns are re-laid out (padded heads: zero rows and columns), and its ``num_key_value_groups`` set to
the stored heads' grouping. The copy computes exactly what the model does, and the sharding pass then
splits its heads evenly: each rank holds its copy of the KV heads its queries read, in its own share
of the KV cache.

The copy shares every tensor the rewrite leaves alone (embeddings, MLPs, norms) with the model. Only
attention written as separate ``q_proj``/``k_proj``/``v_proj``/``o_proj`` linears (Llama, Mistral,
Mixtral, Qwen2 and their kin) can be re-laid out; a fused projection (GPT-2's ``c_attn``) is refused in
one line.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch

from neuroncore.parallel.heads import HeadLayout, head_layout

_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


class HeadLayoutError(ValueError):
    """A model whose heads cannot be laid out for the asked ranks (one line)."""


def head_counts_of(config: Any) -> tuple[int, int]:
    """(query heads, KV heads) of a transformers config (KV heads default to the query heads)."""
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv = int(getattr(config, "num_key_value_heads", 0) or heads)
    return heads, kv


def _attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules()
            if all(isinstance(getattr(m, p, None), torch.nn.Linear) for p in _PROJECTIONS)]


def _rows(weight: torch.Tensor, source: tuple[int, ...], hd: int, dim: int) -> torch.Tensor:
    """``weight`` with its head blocks along ``dim`` taken from ``source`` (-1: zeros)."""
    blocks = weight.split(hd, dim=dim)
    zero = torch.zeros_like(blocks[0])
    return torch.cat([blocks[h] if h >= 0 else zero for h in source], dim=dim)


def _relaid(linear: torch.nn.Linear, source: tuple[int, ...], hd: int, *, outputs: bool) -> torch.nn.Linear:
    """A new linear whose output rows (q/k/v) or input columns (o) follow ``source``."""
    weight = _rows(linear.weight.detach(), source, hd, 0 if outputs else 1)
    out_features, in_features = weight.shape
    new = torch.nn.Linear(in_features, out_features, bias=linear.bias is not None,
                          dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        new.weight.copy_(weight)
        if linear.bias is not None:
            assert new.bias is not None
            new.bias.copy_(_rows(linear.bias.detach(), source, hd, 0) if outputs else linear.bias.detach())
    return new


def layout_for(model: Any, tp: int) -> HeadLayout | None:
    """The layout ``tp`` ranks need, or None when they split the model's heads as they are."""
    heads, kv = head_counts_of(model.config)
    if tp <= 1 or not heads or (heads % tp == 0 and kv % tp == 0):
        return None
    return head_layout(heads, kv, tp)


def with_heads_for(model: Any, tp: int) -> tuple[Any, HeadLayout | None]:
    """``model`` itself when ``tp`` ranks split its heads evenly, else a copy with its attention heads
    laid out for them (module docstring) and the layout used."""
    layout = layout_for(model, tp)
    if layout is None:
        return model, None
    heads, kv = head_counts_of(model.config)
    attentions = _attention_modules(model)
    name = type(model).__name__
    if not attentions:
        raise HeadLayoutError(f"{name}: tp_degree {tp} does not divide its {heads} attention / {kv} KV "
                              f"heads, and its attention has no separate q/k/v/o projections to "
                              f"replicate KV heads in; choose a tp_degree that divides the heads")
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    laid_out = copy.deepcopy(model, memo=shared)
    for attention in _attention_modules(laid_out):
        module: Any = attention  # a transformers attention module (its attributes vary by family)
        hd = int(getattr(module, "head_dim", 0) or module.q_proj.out_features // heads)
        if module.q_proj.out_features != heads * hd or module.k_proj.out_features != kv * hd:
            raise HeadLayoutError(f"{name}: an attention module's projections are not {heads} query "
                                  f"and {kv} KV heads of {hd}")
        module.q_proj = _relaid(module.q_proj, layout.q_source, hd, outputs=True)
        module.k_proj = _relaid(module.k_proj, layout.kv_source, hd, outputs=True)
        module.v_proj = _relaid(module.v_proj, layout.kv_source, hd, outputs=True)
        module.o_proj = _relaid(module.o_proj, layout.q_source, hd, outputs=False)
        module.num_key_value_groups = layout.group
        for attr, value in (("num_heads", layout.heads), ("num_key_value_heads", layout.kv_heads)):
            if isinstance(getattr(module, attr, None), int):
                setattr(module, attr, value)
    return laid_out.eval(), layout


__all__ = ["HeadLayoutError", "head_counts_of", "layout_for", "with_heads_for"]
