"""How attention heads are laid out for ``tp`` ranks when ``tp`` does not divide them: the rule
transformers-neuronx applies (``utils.get_qkv_padding`` with ``GQA.REPLICATED_HEADS``, the fallback it
takes whenever ``tp`` does not divide the KV heads).

Megatron splits the query heads and the KV heads evenly over the ranks, and every rank's query
heads must read KV heads that rank holds. When ``tp`` does not divide the KV heads:

1. query heads are padded up to a multiple of ``tp`` (``n_head_padded``) with zero heads;
2. KV heads are **replicated**: each is copied ``ratio`` times, where ``ratio`` is

   * ``tp / kv`` when ``kv < tp``, ``tp % kv == 0`` and the query heads split evenly as they are or
     their padding is a multiple of ``kv`` (partial replication: one KV head per rank, e.g. Llama-3-8B
     at tp 24 or 32: 8 -> 24 or 32 KV heads);
   * 1 when each rank's share of the padded queries is exactly one KV group (e.g. 72 queries / 24 KV
     heads at tp 32);
   * otherwise ``heads / kv``: every query head gets its own KV copy (the model becomes MHA);

3. KV heads are padded with zero heads up to at least ``tp`` (and to ``n_head_padded`` when fully
   replicated), so every rank holds at least one.

Each stored KV head serves ``n_head_padded / kv_padded`` query slots; a KV head's copies take its
group's queries in order, zero heads filling the rest, so a rank's query heads read only the KV
copy on that rank. Padded query heads have zero output-projection rows: the model computes exactly
what the original does. A model with ``heads == kv_heads`` (MHA) pads both alike. The KV cache holds
the stored KV heads: replication multiplies its size by ``kv_padded / kv`` (each rank keeps its
copy), which is the memory ``bench/llm_decode.py`` and ``NeuronCausalLM`` account.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HeadLayout:
    """Attention heads as ``tp`` ranks store them. ``q_source[i]`` / ``kv_source[j]`` is the original
    head a stored query / KV head holds (-1: a zero padding head); stored KV head ``j`` serves query
    slots ``j * group .. (j + 1) * group - 1``."""

    heads: int
    kv_heads: int
    q_source: tuple[int, ...]
    kv_source: tuple[int, ...]

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def replicated(self) -> bool:
        """Some KV head is stored more than once."""
        real = [j for j in self.kv_source if j >= 0]
        return len(real) != len(set(real))


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def head_counts(heads: int, kv_heads: int, tp: int) -> tuple[int, int, int]:
    """(query heads, KV heads, copies of each KV head) stored for ``tp`` ranks, by transformers-neuronx's
    rule (module docstring)."""
    if tp < 1:
        raise ValueError(f"tp_degree must be a positive integer, not {tp}")
    if kv_heads <= 0 or heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    heads_padded = _round_up(heads, tp)
    if heads == kv_heads:  # MHA: queries and KV heads padded alike
        return heads_padded, heads_padded, 1
    if kv_heads % tp == 0:  # shard over heads: no replication, no padding
        return heads, kv_heads, 1
    pad = heads_padded - heads
    ratio = heads // kv_heads  # full replication: MHA
    if kv_heads < tp and tp % kv_heads == 0 and (heads % tp == 0 or (pad > 0 and pad % kv_heads == 0)):
        ratio = tp // kv_heads  # partial: one KV head per rank
    elif heads_padded * kv_heads == tp * heads:  # a rank's queries are one KV group
        ratio = 1
    kv_padded = max(kv_heads * ratio, tp)
    if kv_padded == heads:
        kv_padded = heads_padded
    return heads_padded, kv_padded, ratio


def head_layout(heads: int, kv_heads: int, tp: int = 1) -> HeadLayout:
    """The stored query and KV heads of ``heads`` / ``kv_heads`` for ``tp`` ranks (module docstring)."""
    heads_padded, kv_padded, ratio = head_counts(heads, kv_heads, tp)
    group = heads // kv_heads
    per_kv = heads_padded // kv_padded  # query slots each stored KV head serves
    if heads_padded % kv_padded or ratio * per_kv < group or kv_padded % tp:
        raise ValueError(f"cannot lay out {heads} query and {kv_heads} KV heads for tp_degree {tp}")
    q_source: list[int] = []
    kv_source: list[int] = []
    for j in range(kv_heads):
        for copy in range(ratio):
            kv_source.append(j)
            for i in range(per_kv):
                q = copy * per_kv + i
                q_source.append(j * group + q if q < group else -1)
    for _ in range(kv_padded - kv_heads * ratio):  # zero KV heads, serving zero queries
        kv_source.append(-1)
        q_source.extend([-1] * per_kv)
    return HeadLayout(heads_padded, kv_padded, tuple(q_source), tuple(kv_source))


__all__ = ["HeadLayout", "head_counts", "head_layout"]
