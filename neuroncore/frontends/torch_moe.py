"""Mixture-of-experts layers compiled the way Neuron's inference library runs them.

transformers' default experts implementation (``grouped_mm``) sorts the tokens by expert, counts
them with ``histc`` and runs a grouped GEMM over data-dependent group sizes: a GPU kernel's plan,
with shapes no static-shape compiler can place. NxD Inference (``neuronx_distributed`` ``ExpertMLPs``)
runs a full-capacity MoE in context encoding with ``forward_all_experts``: every token goes through
every expert and each expert's output is scaled by the token's affinity for it, zero for experts not
in its top-k ("equivalent to running forward_capacity_factor with full capacity ... by avoiding the
permute/unpermute overhead"). Static shapes, dense Tensor-engine matmuls, no token dropping; the cost
is ``num_experts / top_k`` times the routed FLOPs (4x for Mixtral's 8 experts, top-2). Token
generation with fewer than ``num_experts / top_k`` tokens loads only the chosen experts in NxD
(``forward_selective_loading``); that path is not modelled here.

While a transformers model is exported, every experts module (a class decorated with transformers'
``use_experts_implementation``) gets a ``ModuleList`` of per-expert views, ``experts.expert[e]``,
and its config selects the ``"neuron_all_experts"`` implementation registered below. The views make
each expert a layer of its own in the hierarchy (``.../mlp/experts/expert.3``); both are removed and
the config restored when the export returns. The router (softmax, ``topk``, renormalisation) is the
model's own code; ``topk`` is lowered in ``torch_masks``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

IMPLEMENTATION = "neuron_all_experts"


class ExpertView(torch.nn.Module):
    """Expert ``index`` of a transformers experts module: its gate/up and down projections."""

    _experts: Any  # the transformers experts module (its attributes are set by transformers)

    def __init__(self, experts: torch.nn.Module, index: int) -> None:
        super().__init__()
        object.__setattr__(self, "_experts", experts)  # not a submodule: no cycle in the tree
        self.index = index

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        experts = self._experts
        weight = getattr(experts, name)[self.index]
        out = x @ weight if experts.is_transposed else F.linear(x, weight)
        if experts.has_bias:
            out = out + getattr(experts, f"{name}_bias")[self.index]
        return out

    def _gate_and_up(self, x: torch.Tensor) -> torch.Tensor:
        """``act(x @ gate^T) * (x @ up^T)`` with the fused ``[gate; up]`` weight read as two
        weights, as NxD's ``ExpertMLPs`` keeps them: two column-parallel linears under tensor
        parallelism, each rank holding its block of both (one matmul on the fused weight would
        split gate and up across ranks and need their outputs gathered)."""
        experts = self._experts
        weight = experts.gate_up_proj[self.index]
        gate_w, up_w = weight.chunk(2, dim=-1 if experts.is_transposed else 0)
        gate = x @ gate_w if experts.is_transposed else F.linear(x, gate_w)
        up = x @ up_w if experts.is_transposed else F.linear(x, up_w)
        if experts.has_bias:
            gate_b, up_b = experts.gate_up_proj_bias[self.index].chunk(2, dim=-1)
            gate, up = gate + gate_b, up + up_b
        return experts.act_fn(gate) * up

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        experts = self._experts
        if experts.has_gate and _default_gate(experts):
            hidden = self._gate_and_up(hidden_states)
        elif experts.has_gate:
            hidden = experts._apply_gate(self._linear(hidden_states, "gate_up_proj"))
        else:
            hidden = experts.act_fn(self._linear(hidden_states, "up_proj"))
        out = self._linear(hidden, "down_proj")
        if experts.has_post_expert_norm:
            out = experts.post_expert_norm(out)
        return out


def _default_gate(experts: Any) -> bool:
    """Whether ``experts`` gates with transformers' default ``act(gate) * up`` on the halves of a
    concatenated ``[gate; up]`` projection (a model with its own ``_apply_gate`` keeps it)."""
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:
        return False
    gate_fn = getattr(type(experts), "_apply_gate", None)
    return gate_fn is _default_apply_gate and getattr(experts, "is_concatenated", True) \
        and hasattr(experts, "gate_up_proj")


def all_experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
    """NxD's ``forward_all_experts``: every token through every expert, each output scaled by the
    token's (top-k masked) affinity for that expert, summed over experts."""
    num_experts = self.num_experts
    ids = torch.arange(num_experts, device=hidden_states.device)
    chosen = (top_k_index.unsqueeze(-1) == ids).to(top_k_weights.dtype)  # (T, k, E)
    affinity = (chosen * top_k_weights.unsqueeze(-1)).sum(dim=1)  # (T, E), 0 where not chosen
    output = torch.zeros_like(hidden_states)
    for e, expert in enumerate(self.expert):
        output = output + expert(hidden_states) * affinity[:, e:e + 1].to(hidden_states.dtype)
    return output


def _experts_modules(module: torch.nn.Module) -> list[Any]:
    return [m for m in module.modules()
            if hasattr(m, "has_gate") and hasattr(m, "num_experts") and hasattr(m, "down_proj")
            and hasattr(m, "config") and not isinstance(m, ExpertView)]


def _register(transformers: Any) -> bool:
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        return False
    if IMPLEMENTATION not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, all_experts_forward)
    return True


@contextlib.contextmanager
def all_experts(module: torch.nn.Module) -> Iterator[None]:
    """Within: the transformers MoE layers of ``module`` run as NxD's ``forward_all_experts``."""
    transformers = sys.modules.get("transformers")
    found = _experts_modules(module) if transformers is not None else []
    if not found or not _register(transformers):
        yield
        return
    saved: list[tuple[Any, Any]] = []
    try:
        for experts in found:
            experts.expert = torch.nn.ModuleList(ExpertView(experts, e)
                                                 for e in range(experts.num_experts))
            config = experts.config
            saved.append((config, config._experts_implementation))
            config._experts_implementation = IMPLEMENTATION
        yield
    finally:
        for config, previous in reversed(saved):
            config._experts_implementation = previous
        for experts in found:
            if "expert" in experts._modules:
                del experts._modules["expert"]


__all__ = ["IMPLEMENTATION", "ExpertView", "all_experts", "all_experts_forward"]
