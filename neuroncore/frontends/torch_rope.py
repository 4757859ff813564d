"""Dynamic NTK RoPE (``rope_scaling={"rope_type": "dynamic", ...}``) as a static-shape program.

transformers' ``dynamic_rope_update`` (``modeling_rope_utils.py``) recomputes a rotary embedding's
``inv_freq`` in the forward: with ``seq_len = max(position_ids) + 1``, when ``seq_len`` exceeds the
cached length (at first ``max_position_embeddings``) the frequencies become
``_compute_dynamic_ntk_parameters(config, seq_len=seq_len)`` (the NTK base grown with the length)
and the cached length grows; a call shorter than ``max_position_embeddings`` resets them. That is a
Python ``if`` on a tensor's value, which ``torch.export`` refuses (data-dependent control flow).
transformers made Phi-3's longrope traceable the same way this module does dynamic:
``torch.where(seq_len > original, long, short)`` instead of the branch.

While a model is exported, every rotary embedding whose ``rope_type`` is dynamic computes, on the
device, from the call's own ``position_ids``::

    seq_len  = max(position_ids) + 1
    inv_freq = where(seq_len > original_max_seq_len, rope_init_fn(config, seq_len=seq_len), original_inv_freq)

with transformers' own ``rope_init_fn`` given ``seq_len`` as a tensor (it takes one: ``torch.maximum``
with ``max_position_embeddings``, then the NTK base; ``pow`` of a computed base is lowered as
``exp(y * log x)``, torch_frontend ``_aten_pow``), and then runs the embedding's undecorated forward
with those frequencies. Within a static shape the sequence length is still a value: a plain trace
(positions ``arange(L)``, constants) folds it to the frequencies of length ``L`` at trace time; a
generation program (prefill positions from the mask, a decode step's position) computes them from
its positions at run time, so each step of every bucket uses the length transformers' ``generate``
reaches at that step, not the bucket's length.

What is not reproduced: transformers' cached length is state kept across calls, so an eager model
that once saw a longer sequence keeps that length's frequencies for shorter calls above
``max_position_embeddings``. The traced program is stateless: every call uses its own length (what
a freshly loaded model computes; ``generate`` grows the length monotonically, so within one
generation the two agree). The model is restored when the export returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class _WithFrequencies:
    """The rotary embedding as its undecorated forward sees it, with ``inv_freq`` replaced."""

    def __init__(self, module: torch.nn.Module, overrides: dict[str, torch.Tensor]) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_overrides", overrides)

    def __getattr__(self, name: str) -> Any:
        overrides = object.__getattribute__(self, "_overrides")
        if name in overrides:
            return overrides[name]
        return getattr(object.__getattribute__(self, "_module"), name)


def _is_dynamic(module: torch.nn.Module) -> bool:
    rope_type = getattr(module, "rope_type", None)
    types = rope_type.values() if isinstance(rope_type, dict) else [rope_type]
    return any(isinstance(t, str) and "dynamic" in t for t in types) \
        and hasattr(type(module).forward, "__wrapped__") and hasattr(module, "original_max_seq_len")


def _traceable_forward(module: Any) -> Any:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    decorated: Any = type(module).forward
    undecorated = decorated.__wrapped__

    def forward(x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None) -> Any:
        rope_type = module.rope_type if layer_type is None else module.rope_type[layer_type]
        kwargs = {"layer_type": layer_type} if layer_type is not None else {}
        if "dynamic" not in rope_type:
            return decorated(module, x, position_ids, **kwargs)
        prefix = "" if layer_type is None else f"{layer_type}_"
        original = getattr(module, f"{prefix}original_inv_freq").to(x.device)
        seq_len = torch.max(position_ids) + 1  # as dynamic_frequency_update
        grown, _ = ROPE_INIT_FUNCTIONS[rope_type](module.config, x.device, seq_len=seq_len, **kwargs)
        inv_freq = torch.where(seq_len > module.original_max_seq_len, grown.to(original.dtype), original)
        return undecorated(_WithFrequencies(module, {f"{prefix}inv_freq": inv_freq}), x, position_ids,
                           **kwargs)

    return forward


@contextlib.contextmanager
def traceable_dynamic_rope(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, every dynamic-RoPE rotary embedding of ``model`` computes its frequencies
    with ``torch.where`` (above) instead of transformers' branch on the sequence length."""
    patched = [m for m in model.modules() if _is_dynamic(m)]
    for m in patched:
        m.forward = _traceable_forward(m)
    try:
        yield
    finally:
        for m in patched:
            del m.forward
