"""``NeuronCausalLM`` with precision options: int8 weight-only quantised generation (as
transformers-neuronx serves ``quantized=True``) gives the greedy tokens of ``transformers`` running
the same model with its linear weights replaced by their dequantised int8 values."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from neuroncore.compiler import CompilerOptions, Quantization  # noqa: E402
from neuroncore.generation import NeuronCausalLM  # noqa: E402


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def _dequantised(model: torch.nn.Module) -> torch.nn.Module:
    """Every nn.Linear weight [out, in] as q * scale, symmetric int8 per output channel."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight
                scale = w.abs().amax(dim=1, keepdim=True) / 127
                module.weight.copy_(torch.clamp(torch.round(w / scale), -127, 127) * scale)
    return model


def test_int8_weight_only_generation_matches_transformers_on_dequantised_weights():
    torch.manual_seed(1)
    ids = torch.randint(3, 128, (1, 6))
    mask = torch.ones_like(ids)
    options = CompilerOptions(quantize=Quantization.INT8_WEIGHT_ONLY)
    gen = NeuronCausalLM(_llama(), n_positions=(16,), context_length_estimate=8, instance="trn1.2xlarge",
                         options=options)
    out = gen.generate(ids, mask, max_new_tokens=8, eos_token_id=[], pad_token_id=0)
    with torch.no_grad():
        want = _dequantised(_llama()).generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                                pad_token_id=0, eos_token_id=None)
    assert out.tolist() == want.tolist()
    assert len(gen.compiled) == 2  # the prompt bucket and the token bucket, both quantised
    for program in gen._programs.values():
        int8 = [t for t in program.traced.program.hbm_tensors.values() if t.dtype.value == "int8"]
        assert len(int8) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer; lm_head


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_model_loaded_in_half_precision_generates_its_own_tokens(dtype):
    """A model in bf16/fp16 (``from_pretrained(torch_dtype=...)``, the usual way to load one) keeps
    its KV cache in that type: the token-generation programs were traced with an FP32 cache and
    stopped ('query.dtype: BFloat16 key.dtype: float'; found by the inference user trials)."""
    model = _llama().to(dtype)
    torch.manual_seed(2)
    ids = torch.randint(3, 128, (2, 6))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    gen = NeuronCausalLM(model, n_positions=(16,), context_length_estimate=8, batch_size=2,
                         instance="trn1.2xlarge")
    ours = gen.generate(ids, mask, max_new_tokens=5, eos_token_id=None)
    want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours, want)
