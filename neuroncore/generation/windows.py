"""Sliding-window attention in the generation programs: the window as a mask over the cache.

Mistral (``sliding_window``), Mixtral and Qwen2 with ``use_sliding_window`` let a token at sequence
index ``q`` attend to index ``k`` only when ``q - k < window`` (transformers' ``sliding_window_overlay``,
counted in sequence indices, left padding included). The token-generation programs cannot let the
model build that mask itself: a bucket's cache has empty slots between the prompt and the new token,
and the model would count the window back from the end of the bucket (the new token's index in the
program), not from the slot the token really takes. So the programs build the masks themselves, as
4-D masks the model's mask functions pass through unchanged:

* context encoding: padding, causal and window from the prompt's 2-D mask (a fully masked row, a pad
  token's, attends to every position so it stays finite; its keys and values are masked later);
* token generation: the host's 2-D mask of written slots (plus the token itself), and the window
  counted from ``slots``, the token's real slot.

A model with per-layer attention types (Qwen2's ``layer_types``: full layers below
``max_window_layers``, sliding above) gets one mask per type, as its forward takes them.

**What is modelled:** by default the mask: the KV cache stays ``n_positions`` long and a step attends
over its whole bucket, masked positions included (they cost what the hardware spends on them in a
mask-only implementation). ``NeuronCausalLM(..., rolling_cache=True)`` instead keeps a rolling cache
of ``window`` slots, as transformers-neuronx can (slot ``position % window``): the context encoding
lays the prompt's last ``window`` positions into it (a one-hot matmul on the device), each step
attends over the slots whose position is still inside the window (a mask the host computes from the
positions the slots hold) and overwrites the slot of the position leaving it. Memory and decode cost
then stop growing at the window, and a generation can run past the cache's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FULL = "full_attention"
SLIDING = "sliding_attention"


class WindowError(ValueError):
    """A windowed attention the programs cannot reproduce (one line)."""


@dataclass(frozen=True)
class AttentionWindows:
    """The window of each attention type (None: full attention). ``by_layer_type``: the model's
    forward takes a dict of masks keyed by layer type (Qwen2); else one mask for every layer."""

    windows: tuple[tuple[str, int | None], ...]
    by_layer_type: bool
    additive: torch.dtype | None  # eager attention adds a float mask; None: sdpa's boolean mask

    def masks(self, allowed: torch.Tensor, distance: torch.Tensor) -> Any:
        """The mask (or dict of masks) the model takes: ``allowed`` [b, 1, q, k] positions not masked
        by padding or causality, ``distance`` [q, k] (or broadcastable) sequence index distances."""
        out = {}
        for kind, window in self.windows:
            mask = allowed if window is None else allowed & (distance < window)
            mask = mask | ~mask.any(dim=-1, keepdim=True)  # a pad row attends to all: finite
            if self.additive is not None:
                mask = torch.where(mask, torch.zeros((), dtype=self.additive),
                                   torch.full((), torch.finfo(self.additive).min, dtype=self.additive))
            out[kind] = mask
        return out if self.by_layer_type else out[self.windows[0][0]]

    def prefill(self, attention_mask: torch.Tensor) -> Any:
        """Masks of a right-padded prompt: padding, causality and the window."""
        s = attention_mask.shape[1]
        index = torch.arange(s)
        distance = index[:, None] - index[None, :]  # q - k
        allowed = attention_mask.bool()[:, None, None, :] & (distance >= 0)[None, None]
        return self.masks(allowed, distance[None, None])

    def decode(self, attend: torch.Tensor, slots: torch.Tensor) -> Any:
        """Masks of one new token over a bucket's cache plus itself (the last of ``attend``'s
        positions), the window counted from the token's slot."""
        n = attend.shape[1]
        index = torch.arange(n)
        distance = torch.where(index == n - 1, torch.zeros_like(index), slots - index)
        allowed = attend.bool()[:, None, None, :]
        return self.masks(allowed, distance[None, None, None, :])


def attention_windows(model: Any) -> AttentionWindows | None:
    """The sliding windows of a transformers model's attention, or None when it has none."""
    config = model.config
    name = type(model).__name__
    if "local" in (getattr(config, "attention_layers", None) or ()):  # GPT-Neo's local layers
        size = getattr(config, "window_size", "?")
        raise WindowError(f"{name}'s local attention layers (window_size {size}) mask by the position in "
                          f"the traced cache, not the token's slot: not supported")
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    implementation = getattr(config, "_attn_implementation", None) or "sdpa"
    additive = None
    if implementation == "eager":
        additive = next(model.parameters()).dtype
    if types:
        kinds = set(types)
        unknown = sorted(kinds - {FULL, SLIDING})
        if unknown:
            raise WindowError(f"{name} has attention layers of type {', '.join(unknown)}: only full and "
                              f"sliding-window attention are supported")
        if SLIDING not in kinds or not isinstance(window, int):
            return None
        return AttentionWindows(((FULL, None), (SLIDING, window)), True, additive)
    if isinstance(window, int):
        return AttentionWindows(((SLIDING, window),), False, additive)
    return None


__all__ = ["AttentionWindows", "WindowError", "attention_windows"]
