"""Vocabulary-parallel embedding and cross-entropy in tensor-parallel training (Megatron's
``VocabParallelEmbedding`` and ``vocab_parallel_cross_entropy``): the token embedding split by
vocabulary rows (a masked lookup and an all-reduce; its gradient computed on the rank's rows only),
the LM head column-parallel, and the loss from a max all-reduce, a sum-of-exponentials all-reduce
and a target-logit all-reduce, so the whole logits are never gathered. Tied weights (GPT-2's LM
head is its token embedding) stay correct. Against PyTorch and one core after several AdamW steps."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from neuroncore.parallel.sharding import Split
from neuroncore.parallel.tp_train import TensorParallelTrainStep
from neuroncore.training import trace_train_step

transformers = pytest.importorskip("transformers")

VOCAB, ROWS = 64, 16  # 2 x 8 tokens


def _llama(vocab: int = VOCAB) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                                      max_position_embeddings=32, use_cache=False)
    return transformers.LlamaForCausalLM(config)


def _gpt2(vocab: int = VOCAB) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=1, n_head=4, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def _batches() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for _ in range(3):
        ids = torch.randint(0, VOCAB, (2, 8), generator=gen)
        labels = ids.clone()
        labels[0, :3] = -100  # ignored positions
        out.append({"input_ids": ids, "labels": labels})
    return out


def _logits_gathered(step: TensorParallelTrainStep) -> list[str]:
    """All-gathers of a value with the vocabulary along its last dim, or of the flattened
    log-probabilities: what a vocabulary-parallel loss never needs."""
    return [op.name for op in step.rank_program.graph.ops if op.opcode == "all-gather"
            and (op.shape[-1] == VOCAB or op.shape == (ROWS * VOCAB, 1))]


@pytest.mark.parametrize("tp", [2, 4])
def test_llama_vocab_parallel_equals_pytorch_and_one_core(tp: int) -> None:
    model, single_model = _llama(), _llama()
    ref = copy.deepcopy(model)
    example = _batches()[0]
    step = TensorParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-3), example, tp=tp)
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=1e-3), example)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    assert step.split_of("model.embed_tokens.weight") == Split(0)  # vocabulary rows
    assert step.split_of("lm_head.weight") == Split(0)  # column-parallel: vocabulary columns
    ops = step.rank_program.graph.ops
    assert not [op.name for op in ops if op.opcode == "all-gather"]
    loss_reduces = Counter(op.attrs["reduction"] for op in ops
                           if op.opcode == "all-reduce" and op.layer == "model/forward")
    assert loss_reduces == Counter({"max": 1, "sum": 2})  # row max, sum of exps, target logit
    embedding = [op for op in ops if op.opcode == "all-reduce"
                 and op.layer == "model/forward/model/embed_tokens"]
    assert len(embedding) == 1  # the masked lookup's partial rows
    # the embedding's gradient is made on the rank's rows only (a one-hot of VOCAB / tp ids)
    grad = [op for op in ops if op.opcode == "dot" and op.layer == "model/backward/model/embed_tokens"]
    assert [op.shape for op in grad] == [(VOCAB // tp, 32)]
    # the one-core program has the logits whole; each rank's is its vocabulary block
    rank_state = step.rank_states[1].tensors
    assert rank_state["param/model.embed_tokens.weight"].shape == (VOCAB // tp, 32)
    assert rank_state["state/model.embed_tokens.weight/exp_avg"].shape == (VOCAB // tp, 32)
    for batch in _batches():
        loss, one = float(step(**batch)), float(single(**batch))
        expected = ref(**batch).loss
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss == pytest.approx(float(expected.detach()), rel=1e-5)
        assert loss == pytest.approx(one, rel=1e-5)
    for (name, p), q, r in zip(model.named_parameters(), ref.parameters(), single_model.parameters()):
        assert torch.allclose(p, q, atol=1e-5, rtol=0), f"{name}: {(p - q).abs().max()}"
        assert torch.allclose(p, r, atol=1e-5, rtol=0), f"{name}: {(p - r).abs().max()}"


def test_gpt2_tied_vocab_parallel_equals_pytorch() -> None:
    """GPT-2's LM head is its token embedding: one weight split by vocabulary rows for both uses,
    its gradient the sum of the lookup's and the head's, each rank updating its rows."""
    model = _gpt2()
    ref = copy.deepcopy(model)
    example = _batches()[0]
    step = TensorParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-3), example, tp=2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    assert step.split_of("transformer.wte.weight") == Split(0)
    assert not _logits_gathered(step)
    ops = step.rank_program.graph.ops
    assert any(op.opcode == "all-reduce" and op.attrs["reduction"] == "max" for op in ops)
    for batch in _batches():
        loss = float(step(**batch))
        expected = ref(**batch).loss
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss == pytest.approx(float(expected.detach()), rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-5, rtol=0), f"{name}: {(p - q).abs().max()}"
    tied = dict(model.named_parameters(remove_duplicate=False))
    assert tied["lm_head.weight"] is tied["transformer.wte.weight"]  # still tied on the host


def _odd_batches(vocab: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    out = []
    for _ in range(3):
        ids = torch.randint(0, vocab, (2, 8), generator=gen)
        ids[1, 3] = vocab - 1  # the last real entry sits next to the padding
        labels = ids.clone()
        labels[0, :2] = -100
        out.append({"input_ids": ids, "labels": labels})
    return out


@pytest.mark.parametrize(("family", "vocab", "tp"), [("llama", 63, 2), ("llama", 62, 4), ("gpt2", 63, 2)])
def test_vocabulary_tp_does_not_divide_is_padded(family: str, vocab: int, tp: int) -> None:
    """Megatron's and NxD's padded vocabulary: the table and the LM head padded with zero rows to a
    multiple of tp (the last rank's block holds the padding), the padded logits masked out of the
    softmax's maximum and sum, of the loss and of every contraction over the vocabulary, so the step
    equals PyTorch and one core, and the padding stays zero (weights and Adam state)."""
    make = _llama if family == "llama" else _gpt2
    model, single_model = make(vocab), make(vocab)
    ref = copy.deepcopy(model)
    batches = _odd_batches(vocab)
    step = TensorParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batches[0], tp=tp)
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=1e-3), batches[0])
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    table = "model.embed_tokens.weight" if family == "llama" else "transformer.wte.weight"
    assert step.split_of(table) == Split(0)
    rows = -(-vocab // tp)  # ceil: the padded vocabulary's block
    last = step.rank_states[tp - 1].tensors
    assert last[f"param/{table}"].shape == (rows, 32)
    ops = step.rank_program.graph.ops
    if family == "llama":  # still vocabulary-parallel: no logits gathered
        assert not [op.name for op in ops if op.opcode == "all-gather"]
    for batch in batches:
        loss, one = float(step(**batch)), float(single(**batch))
        expected = ref(**batch).loss
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss == pytest.approx(float(expected.detach()), rel=1e-5)
        assert loss == pytest.approx(one, rel=1e-5)
    for (name, p), q, r in zip(model.named_parameters(), ref.parameters(), single_model.parameters()):
        assert p.shape == q.shape, name  # the host's model keeps its own vocabulary
        assert torch.allclose(p, q, atol=1e-5, rtol=0), f"{name}: {(p - q).abs().max()}"
        assert torch.allclose(p, r, atol=1e-5, rtol=0), f"{name}: {(p - r).abs().max()}"
    padding = rows * tp - vocab
    for key in (f"param/{table}", f"state/{table}/exp_avg", f"state/{table}/exp_avg_sq"):
        assert not last[key][rows - padding:].any(), key  # the padded rows never move
        assert last[key][:rows - padding].any(), key
