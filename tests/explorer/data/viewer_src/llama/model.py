"""A stand-in for the framework source a real Neuron profile's stack frames point at (test data for
the profile viewer's code linking; hand-made, not run)."""

import torch


class NeuronAttention(torch.nn.Module):
    def forward(self, x):
        q = self.q_proj(x)
        k = self.k_proj(x)
        v = self.v_proj(x)
        scores = torch.matmul(q, k.transpose(-1, -2))
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, v)


class NeuronMLP(torch.nn.Module):
    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class NeuronLlamaDecoderLayer(torch.nn.Module):
    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))
