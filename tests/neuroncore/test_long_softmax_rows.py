"""Long attention rows (docs/execution-core.md, "Long softmax rows and decode attention"): a
softmax row wider than ``SOFTMAX_CHUNK`` columns is always computed in column chunks, whether
or not the whole row would fit in SBUF; a load of a decode step's cached K/V rows through the
cache-plus-new-row concatenation does not wait for the new row's store."""

from __future__ import annotations

import numpy as np

import neuroncore as nc
from neuroncore.compiler.lower_reduce import SOFTMAX_CHUNK


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_a_row_wider_than_a_chunk_is_computed_in_chunks(run, assert_close, rng) -> None:
    """5,000 columns: 3 equal chunks per row tile (2 batches x 2 row tiles of 130 rows), with
    plenty of SBUF free for the whole row; a 2,048-column row stays whole."""
    b = nc.GraphBuilder("long_softmax")
    x = b.parameter("x", (2, 130, 5000), "fp32")
    g = b.build([b.softmax(x)])
    xs = (rng.standard_normal((2, 130, 5000)) * 4).astype(np.float32)
    res = run(g, [xs])
    assert res.program.stats["chunked_softmax_rows"] == 4
    assert res.program.stats["softmax_chunks"] == 12
    assert "split_softmax_rows" not in res.program.stats  # no chunk was narrowed for lack of room
    assert_close(res.out, _softmax(xs), "fp32")
    assert_close(res.out, res.ref, "fp32")

    b = nc.GraphBuilder("short_softmax")
    x = b.parameter("x", (1, 8, SOFTMAX_CHUNK), "fp32")
    g = b.build([b.softmax(x)])
    xs = rng.standard_normal((1, 8, SOFTMAX_CHUNK)).astype(np.float32)
    res = run(g, [xs])
    assert "chunked_softmax_rows" not in res.program.stats
    assert_close(res.out, _softmax(xs), "fp32")


def _decode_attention(positions: int, dtype: str = "bf16") -> nc.Graph:
    """One decode step's attention for two query heads sharing one KV head (their two query rows
    against the same keys, as a rank of Mistral-7B at tp 24 holds them): the cache (``positions -
    1`` rows) concatenated with the new token's K/V row, computed on the device."""
    b = nc.GraphBuilder("decode_attention")
    q = b.parameter("q", (1, 1, 2, 64), dtype)
    past_k = b.parameter("past_k", (1, 1, positions - 1, 64), dtype)
    past_v = b.parameter("past_v", (1, 1, positions - 1, 64), dtype)
    new_k = b.parameter("new_k", (1, 1, 1, 64), dtype)
    new_v = b.parameter("new_v", (1, 1, 1, 64), dtype)
    k = b.concatenate([past_k, b.add(new_k, new_k)], 2)  # the new rows are computed, then stored
    v = b.concatenate([past_v, b.add(new_v, new_v)], 2)
    scores = b.dot(q, k, rhs_contract=-1, out_dtype="fp32")
    return b.build([b.dot(b.convert(b.softmax(scores), dtype), v)])


def test_a_decode_attention_row_of_4096_positions_matches_torch(run, assert_close, rng) -> None:
    """A decode step over 4,096 positions (bf16, as transformers-neuronx runs it): the FP32 score
    rows of the two query heads are computed in 2 chunks (one row tile), and the output matches
    torch's SDPA within the bf16 tolerance."""
    import torch

    positions = 4096
    g = _decode_attention(positions)
    shapes = [(1, 1, 2, 64), (1, 1, positions - 1, 64), (1, 1, positions - 1, 64), (1, 1, 1, 64),
              (1, 1, 1, 64)]
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    res = run(g, xs)
    assert res.program.stats["chunked_softmax_rows"] == 1
    assert res.program.stats["softmax_chunks"] == positions // SOFTMAX_CHUNK
    q, pk, pv, nk, nv = (torch.tensor(x).to(torch.bfloat16).float() for x in xs)
    k = torch.cat([pk, 2 * nk], dim=2)
    v = torch.cat([pv, 2 * nv], dim=2)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert_close(res.out, expected.numpy(), "bf16")
    assert_close(res.out, res.ref, "bf16")


def test_cached_kv_loads_do_not_wait_for_the_new_rows_store(run) -> None:
    """The loads of the cache's rows through the concatenation depend on no store of the new row;
    the load of the block holding the new row does (else it could read the row before it lands).
    Before, every load of the view waited for the new row's store, which the engine that computed
    the row issues in program order: in Mistral-7B's decode in bucket 16,384 (inf2 tp24) the
    Scalar engine issued V's row store only after the whole softmax, and the PV dot's 4 MiB of V
    loads waited for it (~44 us per layer)."""
    positions = 512
    g = _decode_attention(positions, "fp32")
    shapes = [(1, 1, 2, 64), (1, 1, positions - 1, 64), (1, 1, positions - 1, 64), (1, 1, 1, 64),
              (1, 1, 1, 64)]
    res = run(g, [np.ones(s, np.float32) for s in shapes])
    program = res.program
    nodes = range(len(program.opcode_id))
    texts = [str(program.operands[n]) for n in nodes]
    stores = {n for n in nodes if ".hbm[" in texts[n] and "-> hbm:add." in texts[n]}
    assert len(stores) == 2  # the new K and V rows

    def waits_for_a_store(n: int) -> bool:
        deps = program.dep_idx[program.dep_ptr[n]:program.dep_ptr[n + 1]]
        trigger = int(program.trigger[n])
        if trigger >= 0:
            deps = [*deps, *program.dep_idx[program.dep_ptr[trigger]:program.dep_ptr[trigger + 1]]]
        return any(int(d) in stores for d in deps)

    cached, last = [], []
    for n in nodes:
        text = texts[n]
        if not text.startswith("S[") or "hbm:concatenate." not in text or "-> " not in text:
            continue
        rows = text.split(".view[0][", 1)[1].split(",", 1)[0]
        r1 = int(rows.split(":")[1])
        (last if r1 == positions else cached).append(n)
    assert len(cached) >= 4 and last
    assert not [n for n in cached if waits_for_a_store(n)]
    assert all(waits_for_a_store(n) for n in last)
