"""Wide and padded vocabularies. On-device greedy selection over Llama 3's 128,256 tokens on one
core (its argmax reduced per column chunk, then combined). A vocabulary ``tp_degree`` does not divide
is padded, as transformers-neuronx pads it (``utils.pad_vocab_size``: the LM head's columns padded
with zeros to a multiple of ``tp_degree``, then sharded) and Megatron / NxD pad their
vocabulary-parallel tables: GPT-2's 50,257 tokens at tp 2 and 4. The padded logits are zeros; the
model below makes every real logit negative, so a padded column leaking into the output or the
argmax would win (an id >= 50,257) and fail the tests."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import neuroncore as nc  # noqa: E402
from neuroncore.generation import NeuronCausalLM  # noqa: E402

VOCAB = 50257


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # every token's row shares a large first coordinate, which the final
        model.transformer.wte.weight[:, 0] += 4.0  # norm's bias turns negative: all logits < 0
        model.transformer.ln_f.bias[0] = -8.0
    return model


def _prompt() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.int64)
    mask[1, :2] = 0
    ids[1, :2] = 0
    return ids, mask


@pytest.mark.parametrize("tp", [2, 4])
def test_greedy_tokens_at_a_tp_that_does_not_divide_the_vocabulary_equal_transformers(gpt2, tp):
    ids, mask = _prompt()
    with torch.no_grad():
        assert gpt2(ids, attention_mask=mask).logits.max() < 0
        want = gpt2.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
    gen = NeuronCausalLM(gpt2, n_positions=(16,), batch_size=2, tp_degree=tp, instance="trn1.32xlarge")
    out = gen.generate(ids, mask, max_new_tokens=6, eos_token_id=[], pad_token_id=0)
    assert torch.equal(out, want)  # before: refused ('tp_degree 2 does not divide the 50257 ...')


def test_traced_logits_have_the_real_vocabulary_only(gpt2):
    ids, mask = _prompt()
    inputs = {"input_ids": ids, "attention_mask": mask}
    traced = nc.trace(gpt2, inputs, tp_degree=4, instance="trn1.32xlarge")
    logits = traced(**inputs)[0]
    with torch.no_grad():
        want = gpt2(**inputs).logits
    assert logits.shape == want.shape == (2, 6, VOCAB)
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-5)


def test_on_device_argmax_over_a_128k_vocabulary_on_one_core_gives_transformers_tokens():
    vocab = 128256
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, vocab_size=vocab,
                                      max_position_embeddings=64, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).eval()
    torch.manual_seed(1)
    ids = torch.randint(3, vocab, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.int64)
    mask[1, :2] = 0
    ids[1, :2] = 0
    gen = NeuronCausalLM(model, n_positions=(16,), batch_size=2, instance="trn1.2xlarge",
                         on_device_generation=True)
    out = gen.generate(ids, mask, max_new_tokens=4, eos_token_id=[], pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
    assert torch.equal(out, want)  # before: 'cannot place reduce: reduces 128256 elements per partition'
    assert all(s.device_to_host_bytes == 8 for s in gen.last_timing.steps)  # one id per row
    # the search is spread over the partitions: a decode step costs about what returning the
    # logits does (host selection's program), not 5x (the two rows' 128,256 logits on 2 partitions)
    host = NeuronCausalLM(model, n_positions=(16,), batch_size=2, instance="trn1.2xlarge")
    host.generate(ids, mask, max_new_tokens=2, eos_token_id=[], pad_token_id=0)
    on_device_step, host_step = gen.last_timing.steps[1], host.last_timing.steps[1]
    assert on_device_step.device_time_ns < 1.5 * host_step.device_time_ns


def test_on_device_argmax_over_a_padded_vocabulary_never_picks_the_padding(gpt2):
    ids, mask = _prompt()
    with torch.no_grad():
        want = gpt2.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
    gen = NeuronCausalLM(gpt2, n_positions=(16,), batch_size=2, tp_degree=2, instance="trn1.32xlarge",
                         on_device_generation=True)
    assert torch.equal(gen.generate(ids, mask, max_new_tokens=4, eos_token_id=[], pad_token_id=0), want)
