"""Timing-only traces of models whose parameters are on the meta device (``meta_parameters()``, or
``torch.device("meta")``): shapes without values, so a full-size model compiles without its
weights ever being allocated (bench/models.py runs the full-size ones; here a small config shows
it is the same program as with real weights)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import neuroncore as nc  # noqa: E402
from neuroncore.frontends.torch_frontend import meta_parameters  # noqa: E402


def _config():
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=128)


def _inputs() -> dict:
    torch.manual_seed(0)
    return {"input_ids": torch.randint(3, 128, (2, 8)),
            "attention_mask": torch.ones(2, 8, dtype=torch.int64)}


def test_meta_model_compiles_the_same_program_timing_only():
    torch.manual_seed(0)
    real = transformers.LlamaForCausalLM(_config()).eval()
    with meta_parameters():
        shapes = transformers.LlamaForCausalLM(_config()).eval()
    assert all(p.is_meta for p in shapes.parameters())
    assert not any(b.is_meta for b in shapes.buffers())  # RoPE's frequencies keep their values
    inputs = _inputs()
    with_values, shapes_only = nc.trace(real, inputs), nc.trace(shapes, inputs)
    assert shapes_only.shapes_only and not with_values.shapes_only
    assert shapes_only.program.n_instructions == with_values.program.n_instructions
    timed = shapes_only.timing_only()
    assert timed.outputs is None and timed.device_time_ns > 0
    assert timed.device_time_ns == with_values.timing_only().device_time_ns
    assert shapes_only.last_result is timed
    with pytest.raises(nc.TraceError, match=r"meta device .* runs timing-only"):
        shapes_only(**inputs)


def test_meta_device_model_tensor_parallel_and_bf16():
    with torch.device("meta"):  # buffers on meta too: RoPE's tables are computed on the device
        model = transformers.LlamaForCausalLM(_config()).eval()
    traced = nc.trace(model, _inputs(), instance="trn1.32xlarge", tp_degree=2, dtype="bf16")
    result = traced.timing_only()
    assert len(result.ranks) == 2 and result.device_time_ns > 0
    with pytest.raises(nc.TraceError, match="no bucket of length 4"):
        traced.timing_only(4)


def test_meta_parameters_restores_modules():
    with meta_parameters():
        inside = torch.nn.Linear(4, 4)
    outside = torch.nn.Linear(4, 4)
    assert inside.weight.is_meta and not outside.weight.is_meta and not torch.empty(2).is_meta
