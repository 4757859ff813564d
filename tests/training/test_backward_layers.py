"""Which layer a backward op is filed under in a training step's hierarchy: the layer of the
forward op whose backward formula made it (autograd's link), so both gradient matmuls of a linear
layer sit under that layer, never under the dropout whose masked gradient they read (GPT-2's
``c_proj`` after ``resid_dropout``, Llama's ``o_proj``/``down_proj``, BERT's output dense)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from neuroncore.training.torch_joint import BACKWARD, joint_graph

transformers = pytest.importorskip("transformers")

_DOTS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default}


class Labelled(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids, labels=labels).loss


def _backward_dot_layers(model: torch.nn.Module, labels: torch.Tensor) -> list[str]:
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8))
    joint = joint_graph(Labelled(model), (ids, labels))
    out = []
    for node in joint.module.graph.nodes:
        if node.op == "call_function" and node.target in _DOTS \
                and node.meta.get("train_phase") == BACKWARD:
            stack: dict[str, Any] = node.meta["nn_module_stack"]
            out.append(str(list(stack.values())[-1][0]))
    return out


def _linear_dots(layers: list[str], linears: tuple[str, ...]) -> dict[str, int]:
    return {name: sum(1 for la in layers if la.endswith(name)) for name in linears}


def test_gpt2_gradient_matmuls_belong_to_their_linear_layers() -> None:
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                  bos_token_id=0, eos_token_id=0)
    layers = _backward_dot_layers(transformers.GPT2LMHeadModel(cfg), torch.randint(0, 64, (2, 8)))
    assert not [la for la in layers if "dropout" in la], layers
    # weight gradient and input gradient of each Conv1D, both under it
    assert _linear_dots(layers, ("attn.c_proj", "mlp.c_proj", "attn.c_attn", "mlp.c_fc")) == {
        "attn.c_proj": 2, "mlp.c_proj": 2, "attn.c_attn": 2, "mlp.c_fc": 2}, layers


def test_llama_gradient_matmuls_belong_to_their_linear_layers() -> None:
    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=0)
    layers = _backward_dot_layers(transformers.LlamaForCausalLM(cfg), torch.randint(0, 64, (2, 8)))
    names = ("o_proj", "down_proj", "up_proj", "gate_proj", "q_proj", "k_proj", "v_proj")
    assert _linear_dots(layers, names) == dict.fromkeys(names, 2), layers
    assert not [la for la in layers if la.endswith(("mlp", "act_fn"))], layers


def test_bert_output_dense_gradients_are_not_filed_under_dropout() -> None:
    cfg = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                  num_attention_heads=2, vocab_size=64, max_position_embeddings=16)
    layers = _backward_dot_layers(transformers.BertForSequenceClassification(cfg), torch.tensor([0, 1]))
    assert not [la for la in layers if "dropout" in la or "LayerNorm" in la], layers
    assert _linear_dots(layers, ("output.dense", "intermediate.dense")) == {
        "output.dense": 4, "intermediate.dense": 2}, layers  # attention.output.dense and output.dense
