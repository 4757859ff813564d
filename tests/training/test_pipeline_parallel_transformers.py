"""Pipeline-parallel training of transformers decoders: the exported loss cut into stages by its
decoder layers (embedding on the first stage, final norm + LM head + loss on the last), the
attention mask and rotary position embeddings passed between stages with the hidden states, 1F1B
over micro-batches; equal to one core's gradient accumulation and to PyTorch after several steps."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

from neuroncore.parallel.pp_train import Pass, PipelineParallelTrainStep
from neuroncore.parallel.sharding import Split
from neuroncore.parallel.training import PlanError
from neuroncore.training import trace_train_step

transformers = pytest.importorskip("transformers")

MB, SEQ, VOCAB = 2, 8, 64


def _llama(layers: int = 2, **extra: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, use_cache=False,
        **extra)
    return transformers.LlamaForCausalLM(config)


def _batch(rng: np.random.Generator, micro_batches: int,
           rows: slice = slice(None)) -> dict[str, torch.Tensor]:
    """Keyword inputs, as a transformers model is called."""
    ids = torch.tensor(rng.integers(0, VOCAB, (MB * micro_batches, SEQ)))
    mask = torch.ones_like(ids)
    mask[1::2, :2] = 0  # left padding in every other row: the mask matters
    return {"input_ids": ids[rows], "attention_mask": mask[rows], "labels": ids.clone()[rows]}


def _reference_step(ref: torch.nn.Module, ref_opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                    micro_batches: int) -> None:
    """PyTorch's own step over the same micro-batches: mean loss, gradients accumulated, one update."""
    ref_opt.zero_grad()
    for k in range(micro_batches):
        rows = slice(k * MB, (k + 1) * MB)
        (ref(**{key: t[rows] for key, t in batch.items()}).loss / micro_batches).backward()
    ref_opt.step()


@pytest.mark.parametrize(("pp", "micro_batches"), [(2, 2)])
def test_llama_pipeline_equals_single_core_and_pytorch(pp: int, micro_batches: int) -> None:
    model = _llama()
    single_model, ref = copy.deepcopy(model), copy.deepcopy(model)
    rng = np.random.default_rng(0)
    example = _batch(rng, 1)
    step = PipelineParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-2), example,
                                     pp=pp, micro_batches=micro_batches)
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=1e-2),
                              example, accumulation_steps=micro_batches)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    # the embedding on the first stage; the final norm, LM head and loss on the last
    first, last = set(step.stages[0].params), set(step.stages[-1].params)
    assert "model.model.embed_tokens.weight" in first
    assert {"model.model.norm.weight", "model.lm_head.weight"} <= last
    assert step.stages[0].user_inputs == [0, 1] and step.stages[-1].user_inputs == [2]
    for _ in range(2):
        batch = _batch(rng, micro_batches)
        a, b = float(single(**batch)), float(step(**batch))
        _reference_step(ref, ref_opt, batch, micro_batches)
        assert b == pytest.approx(a, rel=1e-5)
    for (name, p), q, r in zip(model.named_parameters(), single_model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=0, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(p.detach().numpy(), r.detach().numpy(), rtol=0, atol=1e-4, err_msg=name)
    # what flows forward: the hidden states and what every layer reads besides (mask, cos, sin);
    # only the hidden states' gradient flows back
    forward = [t for t in step.transfers if t.kind is Pass.FORWARD and t.micro_batch == 0]
    backward = [t for t in step.transfers if t.kind is Pass.BACKWARD and t.micro_batch == 0]
    assert len(forward) == 4 and len(backward) == 1
    shapes = sorted(v.shape for v in step.received[(Pass.FORWARD, 1, 0)])
    assert shapes == sorted([(MB, SEQ, 32), (MB, 1, SEQ, SEQ), (1, SEQ, 8), (1, SEQ, 8)])


def test_layer_cut_errors_are_one_line() -> None:
    model = _llama(layers=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    example = _batch(np.random.default_rng(0), 1)
    with pytest.raises(PlanError, match=r"3 stages of 2 layers need 2 increasing cut points"):
        PipelineParallelTrainStep(model, opt, example, pp=3, micro_batches=2)
    with pytest.raises(PlanError, match=r"layers='model.lm_head' is not a ModuleList"):
        PipelineParallelTrainStep(model, opt, example, pp=2, micro_batches=2, layers="model.lm_head")


def test_gpt2_with_its_lm_head_tied_to_the_embedding_equals_single_core() -> None:
    """GPT-2's LM head is its token embedding: the first and the last stage both hold it, all-reduce
    its gradient after the last backward (Megatron's embedding group) and update it alike."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    model = transformers.GPT2LMHeadModel(config)
    single_model = copy.deepcopy(model)
    rng = np.random.default_rng(2)
    example, micro_batches = _batch(rng, 1), 2
    step = PipelineParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-2), example,
                                     pp=2, micro_batches=micro_batches)
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=1e-2),
                              example, accumulation_steps=micro_batches)
    assert step.tied_stages == [0, 1]
    wte = "param/transformer.wte.weight"
    for _ in range(2):
        batch = _batch(rng, micro_batches)
        a, b = float(single(**batch)), float(step(**batch))
        assert b == pytest.approx(a, rel=1e-5)
        first, last = (step.stage_states[s][0].tensors[wte] for s in (0, 1))
        np.testing.assert_array_equal(first, last)  # the two copies stay one weight
    for (name, p), q in zip(model.named_parameters(), single_model.parameters()):
        # the key bias's gradient is zero but for rounding, and AdamW's m / sqrt(v) magnifies that
        atol = 1e-4 if name.endswith("c_attn.bias") else 1e-5
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=0, atol=atol, err_msg=name)
    kinds = [r.program.graph.name.rsplit("_", 2)[-2:] for r in step.stage_results[0]]
    assert ["tied", "gradients"] in kinds


def test_llama_pipeline_with_tensor_parallel_stages_equals_single_core() -> None:
    """tp x pp: each stage split Megatron-style over its own tp cores (the tensor-parallel training
    step's sharding pass on the stage's programs), the stages' ranks sending to their peers."""
    model = _llama()
    single_model = copy.deepcopy(model)
    rng = np.random.default_rng(1)
    example = _batch(rng, 1)
    micro_batches = 2
    step = PipelineParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-2), example,
                                     pp=2, micro_batches=micro_batches, tp=2)
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=1e-2),
                              example, accumulation_steps=micro_batches)
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert step.stage_splits[0][f"param/{q_proj}"] is not None  # column-parallel on stage 0's ranks
    for _ in range(2):
        batch = _batch(rng, micro_batches)
        a, b = float(single(**batch)), float(step(**batch))
        assert b == pytest.approx(a, rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), single_model.parameters()):
        # all-reduces add in another order; AdamW's m / sqrt(v) magnifies that where g is ~0
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=0, atol=1e-4, err_msg=name)
    # stage s's tp ranks run on cores 2s and 2s+1; each all-reduces over its stage's ranks
    cores = {(r.core, r.program.graph.name.rsplit("_", 1)[-1]) for r in step.last_results}
    assert {c for c, _ in cores} == {0, 1, 2, 3}
    reduces = [op for op in step.backward_programs[0].loaded.program.graph.ops if op.opcode == "all-reduce"]
    assert reduces


def test_tied_llama_at_tp2_pp2_equals_single_core() -> None:
    """Tied weights across stages with tensor-parallel stages: the first stage's embedding and the
    last stage's LM head are one weight, vocabulary-split on both; rank r of each holder all-reduces
    its block of the gradient with rank r of the other (the first stage keeps the table's gradient
    whole and all-reduces its block r, as its optimizer reads it), then both update alike."""
    model = _llama(layers=2, tie_word_embeddings=True)
    single_model = copy.deepcopy(model)
    rng = np.random.default_rng(2)
    example, micro_batches = _batch(rng, 1), 2
    step = PipelineParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-2), example,
                                     pp=2, micro_batches=micro_batches, tp=2)
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=1e-2),
                              example, accumulation_steps=micro_batches)
    assert step.tied_stages == [0, 1]
    table = "param/model.embed_tokens.weight"
    assert step.stage_splits[0][table] == step.stage_splits[1][table] is not None
    # each tied all-reduce runs over one rank of every holder: cores {0, 2} and {1, 3}
    reduces = [t for _, t in step.tied_programs[0].collectives]
    assert reduces and all(sorted(map(sorted, t.replica_groups)) == [[0, 2], [1, 3]] for t in reduces)
    for _ in range(2):
        batch = _batch(rng, micro_batches)
        a, b = float(single(**batch)), float(step(**batch))
        assert b == pytest.approx(a, rel=1e-5)
        for r in range(2):  # the two copies of every rank's block stay one weight
            first, last = (step.stage_states[s][r].tensors[table] for s in (0, 1))
            np.testing.assert_array_equal(first, last)
    for (name, p), q in zip(model.named_parameters(), single_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=0, atol=1e-4, err_msg=name)
    cores = {r.core for r in step.last_results if r.program.graph.name.endswith("tied_gradients")}
    assert cores == {0, 1, 2, 3}


def test_gpt2_at_tp2_pp2_equals_single_core() -> None:
    """GPT-2 at tp 2 x pp 2: its fused c_attn runs attention whole, so c_proj is column-parallel and
    the residual stream is split along the hidden dim at the stage's end. The hidden states travel
    as each rank's block (Megatron's scatter-gather of pipeline sends), the next stage reads them
    split and sends their gradient back split alike; the tied table is split alike on both holders."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    model = transformers.GPT2LMHeadModel(config)
    single_model, ref = copy.deepcopy(model), copy.deepcopy(model)
    rng = np.random.default_rng(2)
    example, micro_batches = _batch(rng, 1), 2
    step = PipelineParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-2), example,
                                     pp=2, micro_batches=micro_batches, tp=2)
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=1e-2),
                              example, accumulation_steps=micro_batches)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    hidden = [n for n in step.stages[0].sends if step.sent_splits[(1, n)] is not None]
    assert len(hidden) == 1 and step.sent_splits[(1, hidden[0])] == Split(2)  # the residual, by hidden
    wte = "param/transformer.wte.weight"
    assert step.stage_splits[0][wte] == step.stage_splits[1][wte] is not None
    for _ in range(2):
        batch = _batch(rng, micro_batches)
        a, b = float(single(**batch)), float(step(**batch))
        _reference_step(ref, ref_opt, batch, micro_batches)
        assert b == pytest.approx(a, rel=1e-5)
        for r in range(2):  # the two copies of every rank's block stay one weight
            first, last = (step.stage_states[s][r].tensors[wte] for s in (0, 1))
            np.testing.assert_array_equal(first, last)
    # each rank sends its block of the hidden states: half the bytes of the whole value
    sent = [t for t in step.transfers
            if t.kind is Pass.FORWARD and t.micro_batch == 0 and t.value == hidden[0]]
    assert [t.size_bytes for t in sent] == [MB * SEQ * 32 * 4 // 2]
    assert step.received[(Pass.FORWARD, 1, 0)][1].shape == (MB, SEQ, 32)  # whole again on the host side
    for (name, p), q, r in zip(model.named_parameters(), single_model.parameters(), ref.parameters()):
        # the key bias's gradient is zero but for rounding, and AdamW's m / sqrt(v) magnifies that
        atol = 1e-4 if name.endswith("c_attn.bias") else 1e-5
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=0, atol=atol, err_msg=name)
        np.testing.assert_allclose(p.detach().numpy(), r.detach().numpy(), rtol=0, atol=1e-4, err_msg=name)


def test_llama_sequence_parallel_inside_tp2_pp2_stages_equals_single_core_and_pytorch() -> None:
    """Sequence parallelism inside the stages (Megatron / NxD ``sequence_parallel_enabled`` with
    pipeline parallelism): every stage's norms and residuals run on its rank's tokens, the hidden
    states leave a stage split along the sequence, each rank sending its tokens to its peer, and the
    next stage starts from them (its first norm on the rank's tokens, an all-gather into q/k/v)."""
    model = _llama()
    single_model, ref = copy.deepcopy(model), copy.deepcopy(model)
    rng = np.random.default_rng(1)
    example, micro_batches = _batch(rng, 1), 2
    step = PipelineParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-2), example,
                                     pp=2, micro_batches=micro_batches, tp=2, sequence_parallel=True)
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=1e-2),
                              example, accumulation_steps=micro_batches)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    # the hidden states travel split along the sequence; mask, cos and sin whole
    splits = [step.sent_splits[(1, n)] for n in step.stages[0].sends]
    assert sorted(map(str, splits)) == sorted(["Split(dim=1, outer=1)", "None", "None", "None"])
    for s in range(2):  # each stage's layers reduce-scatter out of and all-gather into their blocks
        ops = {op.opcode for op in step.backward_programs[s].loaded.program.graph.ops}
        assert {"reduce-scatter", "all-gather"} <= ops
    for _ in range(2):
        batch = _batch(rng, micro_batches)
        a, b = float(single(**batch)), float(step(**batch))
        _reference_step(ref, ref_opt, batch, micro_batches)
        assert b == pytest.approx(a, rel=1e-5)
    (hidden,) = [n for n, split in zip(step.stages[0].sends, splits) if split is not None]
    sent = [t for t in step.transfers if t.kind is Pass.FORWARD and t.micro_batch == 0 and t.value == hidden]
    assert [t.size_bytes for t in sent] == [MB * SEQ * 32 * 4 // 2]  # the rank's tokens
    back = [t for t in step.transfers if t.kind is Pass.BACKWARD and t.micro_batch == 0]
    assert [t.size_bytes for t in back] == [MB * SEQ * 32 * 4 // 2]  # the gradient: the rank's tokens
    for (name, p), q, r in zip(model.named_parameters(), single_model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=0, atol=1e-4, err_msg=name)
        np.testing.assert_allclose(p.detach().numpy(), r.detach().numpy(), rtol=0, atol=1e-4, err_msg=name)


def test_a_forward_that_updates_its_own_values_in_place_is_refused_in_one_line() -> None:
    """T5 shifts its labels into decoder ids by in-place writes into a fresh tensor: a stage replays
    its part of the exported graph as it is, so it trained on stale values (loss 5.25 against
    PyTorch's 5.03). One core functionalizes those writes; pipeline stages refuse them, in one line."""
    from neuroncore.frontends.tracing import TraceError

    torch.manual_seed(0)
    config = transformers.T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8, vocab_size=VOCAB,
                                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    model = transformers.T5ForConditionalGeneration(config)
    example = {"input_ids": torch.randint(3, VOCAB, (MB, SEQ)), "labels": torch.randint(3, VOCAB, (MB, 5))}
    with pytest.raises(TraceError, match=r"stage 0: the forward updates its own values in place") as err:
        PipelineParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-2), example,
                                  pp=2, micro_batches=2)
    assert "\n" not in str(err.value)
