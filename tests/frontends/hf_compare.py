"""Shared check for Hugging Face families with default settings: run the model in torch (fp32 and
its own bf16 autocast) and on the core (fp32 and ``dtype="bf16"``), compare every output tensor.

FP32 is held to rtol 1e-4 / atol 1e-5 (rtol 2e-4 / atol 5e-5 for outputs that pass through
convolutions' long sums); bf16 to at most ``BF16_FACTOR`` x torch's own bf16-vs-fp32 error on the
first output (the logits or last hidden state), as tests/frontends/test_torch_models.py does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

import neuroncore as nc

BF16_FACTOR = 2.0


def leaves(out: Any) -> list[torch.Tensor]:
    """The output tensors in pytree order (a ModelOutput's fields, a DynamicCache's keys then values)."""
    return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


def _call(model: Any, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def compare(model: torch.nn.Module, inputs: Any, *, rtol: float = 1e-4, atol: float = 1e-5,
            bf16: bool = True, bf16_output: int = 0) -> tuple[Any, dict[str, float]]:
    """Trace ``model`` with default settings, check it against torch; return (traced, errors).
    ``bf16_output`` picks the output whose bf16 error is held to ``BF16_FACTOR`` x torch's."""
    model.eval()
    traced = nc.trace(model, inputs)  # exports first: transformers' cache is registered for pytree
    with torch.no_grad():
        exact = leaves(_call(model, inputs))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            framework_bf16 = leaves(_call(model, inputs))[bf16_output].float()
    ours = list(_call(traced, inputs))
    assert len(ours) == len(exact), (len(ours), len(exact))
    for got, want in zip(ours, exact):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    errors = {"fp32": max((g.float() - w.float()).abs().max().item() for g, w in zip(ours, exact)),
              "scale": exact[0].abs().max().item()}
    if bf16:
        traced_bf16 = nc.trace(model, inputs, dtype="bf16")
        ours_bf16 = list(_call(traced_bf16, inputs))[bf16_output].float()
        reference = exact[bf16_output]
        errors["bf16"] = (ours_bf16 - reference).abs().max().item()
        errors["torch_bf16"] = (framework_bf16 - reference).abs().max().item()
        assert errors["torch_bf16"] > 0
        assert errors["bf16"] <= BF16_FACTOR * errors["torch_bf16"], errors
    return traced, errors
