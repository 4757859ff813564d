"""Dynamic NTK RoPE in generation: transformers recomputes the rotary frequencies from
``max(position_ids) + 1`` once it passes ``max_position_embeddings``; each program computes them
from its own positions on the device (neuroncore/frontends/torch_rope.py), so every step of every
bucket matches ``generate``, whose length grows by one per token."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from neuroncore.generation import NeuronCausalLM  # noqa: E402

T = transformers


def _llama(rope_scaling: dict | None) -> torch.nn.Module:
    torch.manual_seed(2)
    config = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                           max_position_embeddings=4, rope_theta=100.0, rope_scaling=rope_scaling,
                           pad_token_id=0)
    model = T.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper attention, so the frequencies decide tokens
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4)
            layer.self_attn.k_proj.weight.mul_(4)
    return model


def test_dynamic_ntk_rope_generates_transformers_tokens_across_buckets():
    dynamic = {"rope_type": "dynamic", "factor": 8.0, "rope_theta": 100.0}
    torch.manual_seed(1)
    ids = torch.randint(3, 128, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.int64)
    mask[1, :2] = 0
    ids[1, :2] = 0
    new = 14  # contexts 7..19: buckets 8, 16 and 32, every one past max_position_embeddings
    gen = NeuronCausalLM(_llama(dynamic), n_positions=(8, 16, 32), context_length_estimate=8,
                         batch_size=2, instance="trn1.2xlarge")
    out = gen.generate(ids, mask, max_new_tokens=new, eos_token_id=[], pad_token_id=0)
    with torch.no_grad():
        want = _llama(dynamic).generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                        pad_token_id=0, eos_token_id=None)
        plain = _llama(None).generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                      pad_token_id=0, eos_token_id=None)
    assert torch.equal(out, want)
    assert (want != plain).sum() >= 5  # the frequencies decide tokens: the test can fail
    assert {s.bucket for s in gen.last_timing.steps} == {8, 16, 32}
