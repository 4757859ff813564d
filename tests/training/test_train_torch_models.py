"""Training steps of real model families on the core against PyTorch: a CNN (convolution, max-pool
and exact-GELU backward), and transformers models from configs whose forward returns the loss
(BERT with classification labels, Llama with causal-LM labels)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import neuroncore
from tests.fixtures.labelled import Labelled

transformers = pytest.importorskip("transformers")


def _compare(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], steps: int,
             loss_fn: Callable[..., torch.Tensor] | None = None, atol: float = 1e-5) -> None:
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    step = neuroncore.trace_train_step(model, opt, inputs, loss_fn=loss_fn)
    for _ in range(steps):
        loss = float(step(*inputs))
        out = ref(*inputs[:-1]) if loss_fn is not None else ref(*inputs)
        expected = loss_fn(out, inputs[-1]) if loss_fn is not None else out
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss == pytest.approx(float(expected), rel=1e-5)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.allclose(p, q, atol=atol, rtol=0), f"{name}: {(p - q).abs().max()}"


def test_cnn_with_strided_padded_conv_and_overlapping_max_pool() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1, stride=2), torch.nn.GELU(),
        torch.nn.MaxPool2d(3, stride=1, padding=1), torch.nn.Conv2d(4, 4, 3), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(4 * 2 * 2, 4))
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 4, (2,))
    _compare(model, (x, y), steps=2, loss_fn=F.cross_entropy)


def test_cnn_with_ceil_mode_max_pools() -> None:
    """Max pools with ``ceil_mode=True`` (inference supports them since session 10) train: their
    backward routes the gradient of the last, shorter windows too; it was refused."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, stride=2, ceil_mode=True),                # 9 -> 4 (a partial window)
        torch.nn.Conv2d(4, 4, 1), torch.nn.MaxPool2d(2, padding=1, ceil_mode=True),  # 4 -> 3
        torch.nn.Flatten(), torch.nn.Linear(4 * 3 * 3, 4))
    x, y = torch.randn(2, 3, 9, 9), torch.randint(0, 4, (2,))
    _compare(model, (x, y), steps=2, loss_fn=F.cross_entropy)


def test_cnn_with_grouped_and_depthwise_convolutions() -> None:
    """Grouped (2 groups, strided) and depthwise convolutions train: their backward is refused
    otherwise (found by the user trials)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 4))
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 4, (2,))
    _compare(model, (x, y), steps=2, loss_fn=F.cross_entropy)


def test_bert_sequence_classification_from_a_config() -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        num_labels=3)
    model = Labelled(transformers.BertForSequenceClassification(config))
    ids, labels = torch.randint(0, 64, (2, 8)), torch.randint(0, 3, (2,))
    _compare(model, (ids, labels), steps=2)


def test_llama_causal_lm_from_a_config() -> None:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32)
    model = Labelled(transformers.LlamaForCausalLM(config), use_cache=False)
    ids = torch.randint(0, 64, (2, 8))
    _compare(model, (ids, ids), steps=2)


def test_mixtral_trains_with_its_default_experts() -> None:
    """Mixtral with defaults: transformers' grouped_mm experts (sort, histc) have no static shape; the
    step exports them as NxD's forward_all_experts, as inference does (refused before; found by the
    user trials). Adam amplifies rounding in near-zero gradients: 1e-4."""
    torch.manual_seed(0)
    config = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                        num_local_experts=4, num_experts_per_tok=2)
    ids = torch.randint(0, 64, (2, 8))
    _compare(Labelled(transformers.MixtralForCausalLM(config)), (ids, ids), steps=2, atol=1e-4)


def test_gptj_rotary_strided_slices_train() -> None:
    """GPT-J's rotary embedding slices every other feature (``x[..., ::2]``): the backward writes
    them back with strided ``slice_scatter``s (found by the user trials)."""
    torch.manual_seed(0)
    config = transformers.GPTJConfig(vocab_size=64, n_embd=32, n_layer=1, n_head=4, rotary_dim=4,
                                     n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ids = torch.randint(0, 64, (2, 8))
    _compare(Labelled(transformers.GPTJForCausalLM(config)), (ids, ids), steps=2)


def test_t5_shifts_its_labels_into_decoder_ids_in_place() -> None:
    """T5 builds its decoder inputs from the labels with in-place writes into a fresh tensor
    (``shifted[..., 1:] = labels[..., :-1]``). Replayed unfunctionalized, the step folded the
    decoder ids to the zeros they started as and trained on them (loss 5.08 against torch's 5.17)."""
    torch.manual_seed(0)
    config = transformers.T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=4, d_kv=8, vocab_size=64,
                                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    model = Labelled(transformers.T5ForConditionalGeneration(config))
    ids, labels = torch.randint(3, 64, (2, 8)), torch.randint(3, 64, (2, 5))
    _compare(model, (ids, labels), steps=2, atol=1e-4)


def test_batch_norm_in_train_mode_updates_its_running_statistics() -> None:
    """Batch statistics in the forward, their gradient in the backward, and the running mean and
    variance (unbiased) carried on the device and copied back like the parameters."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 3), torch.nn.BatchNorm1d(3))
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 3, 6, 6), torch.randint(0, 3, (4,))
    step = neuroncore.trace_train_step(model, opt, (x, y), loss_fn=F.cross_entropy)
    for _ in range(3):
        loss = float(step(x, y))
        expected = F.cross_entropy(ref(x), y)
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss == pytest.approx(float(expected), rel=1e-5)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.allclose(p, q, atol=1e-5), name
    for (name, a), (_, b) in zip(model.named_buffers(), ref.named_buffers()):
        assert torch.allclose(a.float(), b.float(), atol=1e-5), name
    assert int(model[1].num_batches_tracked) == 3


def test_falcon_indexes_its_fused_qkv_with_constant_lists() -> None:
    """Falcon's multi-query split reads ``qkv[..., [-2], :]``: the list is a tensor constant the
    export lifts into an input. It is known at trace time (a slice), as in inference; before, the
    step stopped in the compiler on ``aten.index`` (found by the user trials)."""
    torch.manual_seed(0)
    config = transformers.FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4)
    model = Labelled(transformers.FalconForCausalLM(config))
    ids = torch.randint(0, 64, (2, 8))
    _compare(model, (ids, ids), steps=2)
