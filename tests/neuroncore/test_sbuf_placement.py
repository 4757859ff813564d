"""SBUF placement under pressure: no buffer is freed twice, so the free list never fragments into
overlapping ranges (the defect that made Llama-2-13B tp8 training stop on ``cannot place
constant.90.blk``: a dot's held operand block was spilled, then freed again on release)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler.memory import DoubleFree, RangeAllocator
from neuroncore.hardware import core_spec
from neuroncore.workloads.train_graphs import RankShapes, Transformer, layer_forward


def test_a_range_released_twice_is_refused() -> None:
    sbuf = RangeAllocator(4096)
    at, _ = sbuf.allocate(256)
    other, _ = sbuf.allocate(256)
    sbuf.release(at, 256, [])
    with pytest.raises(DoubleFree):
        sbuf.release(at, 256, [])
    with pytest.raises(DoubleFree):  # a range overlapping free space is a double free too
        sbuf.release(at + 64, 64, [])
    sbuf.release(other, 256, [])
    assert sbuf.free == [(0, 4096)] and sbuf.in_use == 0


@pytest.mark.parametrize("ring", [0.0, 0.5])  # ringless (``_allocate_anywhere``), ringed (``_next_fit``)
def test_next_fit_moves_on_when_the_range_at_the_cursor_is_too_short_past_it(ring: float) -> None:
    """The cursor inside a free range with 192 bytes past it and 256-byte buffers to place, each
    freed (its reader recorded) before the next is asked: Mistral-7B's inf2 b8 decode in bucket
    8,192 put 65 K-cache blocks in a row at one slot that way, each waiting for the one before it.
    A next-fit moves on to the next range with room, so each block lands past the one before and
    inherits no reader; before, every block went back to the short range's start, behind the
    cursor, and waited for its predecessor's reader."""
    sbuf = RangeAllocator(16 * 1024, stream_fraction=ring)
    sbuf.free, sbuf.cursor = [(1024, 1472), (4096, 6144)], 1280
    sbuf.in_use = sbuf.capacity - 448 - 2048
    placed, inherited = [], []
    for reader in range(6):
        at, hazards = sbuf.allocate(256)
        placed.append(at)
        inherited += hazards
        sbuf.release(at, 256, [reader])
    assert placed == [4096 + 256 * i for i in range(6)] and inherited == []
    # nothing past the cursor: wrap to the lowest range first, the one behind the cursor last
    sbuf.free, sbuf.cursor = [(0, 512), (1024, 1472)], 1280
    assert sbuf.allocate(256)[0] == 0
    sbuf.free, sbuf.cursor = [(1024, 1472)], 1280
    assert sbuf.allocate(256)[0] == 1024
    assert sbuf.cursor == 1280 and sbuf.free == [(1280, 1472)]


def test_training_layer_forward_compiles_when_operand_tiles_are_spilled() -> None:
    """A Llama layer forward (tp 2, 1,024 tokens) on a core with a quarter of SBUF: attention's
    batched dots hold resident blocks of v while SBUF is full, so those tiles get spilled before the
    dot releases them. Before the fix each was freed twice, the free list fragmented and the
    gate_proj dot stopped with 'cannot place ... nothing more can be spilled'."""
    model = Transformer("llama-sbuf", 1, 1280, 10, 10, 3456, 1000)
    shapes = RankShapes.of(model, 1, 1024, 2)
    spec = dataclasses.replace(core_spec("trn1"), sbuf_bytes_per_partition=48 * 1024)
    program = nc.compile(layer_forward(model, shapes, 2, "bf16"), spec)
    assert program.stats["spilled_tiles"] > 0
    assert program.stats["sbuf_peak_bytes_per_partition"] <= spec.sbuf_bytes_per_partition


def test_llama2_7b_tp32_prefill_layer_compiles_when_a_dot_output_tile_has_no_room() -> None:
    """One Llama-2-7B layer of the tp32 trn1 prefill of 4 x 2,048 tokens (the bench grid's
    ``llama2-7b/trn1.32xlarge/tp32/b4/2048-2048``; a 4,096-token vocabulary, the layer as in the
    grid), compiled only (~2 CPU s): layer 0's gate_proj dot writes silu(x @ W) feature-major, three
    16 KiB tiles; its own blocks, partial sums and first two tiles left no free range of 16 KiB and
    nothing else was resident to spill. Before, the compile stopped with 'cannot place silu.75.t2:
    needs 16384 bytes per partition but only 14528 are free'; then that tile went to HBM as written
    (staged). Since the RMSNorm's row statistics step with their fusion group (e709753), less is
    resident at that dot and the tile fits: the grid key must still compile, with nothing staged
    (the staging itself is forced and checked by the next test)."""
    from neuroncore.parallel import TensorParallelModel
    from neuroncore.runtime import Instance
    from neuroncore.workloads import get

    graph = get("llama-prefill").graph("llama2-7b", batch=4, context=2048, tp_degree=32, layers=1,
                                       vocab=4096)
    group = TensorParallelModel.load(graph, Instance("trn1.32xlarge"), tp_degree=32)
    stats = group.program.stats
    assert stats.get("staged_tiles", 0) == 0 and stats["spilled_tiles"] > 0  # under SBUF pressure


def test_a_produced_tile_with_no_room_goes_to_hbm(monkeypatch, run, assert_close, rng) -> None:
    """A value tile that cannot be placed when its producer writes it (every spillable tile spilled,
    no free range wide enough) is written through staging buffers to HBM and read back from there
    by its readers: the results are the same. The allocation of ``silu(x @ w)``'s second tile is
    made to fail as in the 7B prefill above (before: the compile stopped there)."""
    from neuroncore.compiler import context as ctx_module
    from neuroncore.compiler.errors import CompileError

    b = nc.GraphBuilder("staged_tile")
    x = b.parameter("x", (384, 256), "fp32")
    w = b.parameter("w", (256, 192), "fp32")
    h = b.silu(b.matmul(x, w))
    g = b.build([b.multiply(h, b.add(h, 1.0))])
    alloc = ctx_module.Context.alloc
    refused: list[str] = []

    def no_room_for_tile_1(self, partitions, free, dtype, name, **kwargs):
        if name.startswith("silu.") and name.endswith(".t1") and not refused:  # when produced
            refused.append(name)
            raise CompileError(f"cannot place {name}: no room (test)", self.current_op)
        return alloc(self, partitions, free, dtype, name, **kwargs)

    monkeypatch.setattr(ctx_module.Context, "alloc", no_room_for_tile_1)
    xs = rng.standard_normal((384, 256)).astype(np.float32) / 16
    ws = rng.standard_normal((256, 192)).astype(np.float32)
    res = run(g, [xs, ws])
    assert refused and res.program.stats["staged_tiles"] == 1
    assert_close(res.out, res.ref, "fp32")


def test_a_tile_spilled_between_its_producers_column_blocks_keeps_the_columns_written(
        monkeypatch, run, assert_close, rng) -> None:
    """A dot writes its output tile a column block at a time and unpins it after each block, so the
    tile can be spilled half written (seen in the Llama-2-7B decode's gate_proj and the 70B tp32
    rank). The next block must bring back the columns written so far before writing more, and the
    HBM copy is stale from then on. Before, the next block wrote into a fresh buffer: the first
    columns were lost (wrong results) and a later spill skipped the store (the tile was marked as in
    HBM). Here tile 0 of ``x @ w`` (512 columns per block) is spilled when its third block starts."""
    from neuroncore.compiler import context as ctx_module

    b = nc.GraphBuilder("spilled_half_written")
    x = b.parameter("x", (128, 256), "fp32")
    w = b.parameter("w", (256, 1536), "fp32")
    g = b.build([b.multiply(b.matmul(x, w), 2.0)])
    produce = ctx_module.Context.produce
    spilled: list[str] = []

    def spill_tile_0_at_its_third_block(self, op, t, c0=0, c1=None, rows=None):
        value = self.values[op.index]
        if op.opcode == "dot" and t == 0 and c0 == 1024 and value.bufs[0] is not None:
            self.pinned.discard(value.bufs[0].id)
            self._spill_tile(value, 0)
            spilled.append(op.name)
        return produce(self, op, t, c0, c1, rows)

    monkeypatch.setattr(ctx_module.Context, "produce", spill_tile_0_at_its_third_block)
    xs = rng.standard_normal((128, 256)).astype(np.float32)
    ws = rng.standard_normal((256, 1536)).astype(np.float32)
    res = run(g, [xs, ws])
    assert spilled
    assert_close(res.out, res.ref, "fp32")


def _context(sbuf_bytes: int):
    """A lowering context over a one-op graph on a core with ``sbuf_bytes`` per partition and no
    weight ring, for placement tests that set the free list by hand."""
    from neuroncore.compiler.context import Context

    b = nc.GraphBuilder("placement")
    x = b.parameter("x", (128, 64), "fp32")
    spec = dataclasses.replace(core_spec("trn1"), sbuf_bytes_per_partition=sbuf_bytes)
    ctx = Context(b.build([b.exp(x)]), spec)
    ctx.sbuf.end_ring()
    return ctx


def test_scratch_taken_together_is_placed_largest_first_when_the_order_asked_finds_no_room() -> None:
    """An op's scratch (a softmax's max, sum and exp row) asked small ones first: the first small
    buffer lands at the rotating cursor, the start of the only range wide enough for the large one,
    which then finds 64 bytes too few (Mistral-7B's bucket-16,384 decode softmax: 65,408 free of the
    65,536 its exp row needs). ``alloc_together`` gives the small one back and places the large one
    first; before, the compile stopped."""
    from neuroncore.compiler.errors import CompileError
    from neuroncore.dtypes import DType

    ctx = _context(4096)
    sbuf = ctx.sbuf
    sbuf.free, sbuf.in_use, sbuf.cursor = [(0, 512), (1024, 2048)], 4096 - 1536, 1024
    small, large = (128, 1, DType.FP32, "s.max"), (128, 256, DType.FP32, "s.exp")  # 64 B, 1 KiB
    assert ctx.alloc_together([small]) and not sbuf.fits([1024])  # in the order asked: no room
    with pytest.raises(CompileError, match=r"cannot place s\.exp"):
        ctx.alloc(*large)
    sbuf.free, sbuf.in_use, sbuf.cursor = [(0, 512), (1024, 2048)], 4096 - 1536, 1024
    first, second = ctx.alloc_together([small, large])
    assert (second.address, first.address) == (1024, 0)  # the large one where it fits, then the small
    assert ctx.stats["reordered_allocations"] == 1


def test_the_identity_is_made_again_elsewhere_when_it_splits_the_room_a_buffer_needs() -> None:
    """The PE transposes' identity (256 bytes, made once at the cursor and kept) between two free
    ranges that together hold a buffer (Mistral-7B's b4 decode softmax in bucket 16,384: 54,464
    bytes the widest free range, 65,792 of 196,608 in use): it is given up and made again at its
    next use; before, nothing could move it and the compile stopped."""
    from neuroncore.dtypes import DType

    ctx = _context(8192)
    ctx.sbuf.cursor = 1024
    ident = ctx.identity(DType.BF16)
    assert ctx.buffers[ident.buf].address == 1024
    ctx.unpin_all()
    buf = ctx.alloc(128, 3500, DType.BF16, "wide")  # 7,000 bytes: 6,912 each side of the identity
    assert ctx.stats["identity_remade"] == 1 and buf.address < 1024 + 256  # over the old identity
    ctx.free(buf)
    again = ctx.identity(DType.BF16)
    assert again.buf != ident.buf  # made again (one more IOTA) where there is room


def _inf2_tp24_rank(workload: str, model: str, **sizes):
    """The inf2.48xlarge tp24 rank program of a full-width model with ``sizes`` reduced (layers,
    vocabulary), compiled only."""
    from neuroncore.parallel import TensorParallelModel
    from neuroncore.runtime import Instance
    from neuroncore.workloads import get

    graph = get(workload).graph(model, tp_degree=24, vocab=4096, **sizes)
    return TensorParallelModel.load(graph, Instance("inf2.48xlarge"), tp_degree=24).program


@pytest.mark.parametrize("batch", [1, 4])
def test_mistral_7b_decode_in_bucket_16384_compiles(batch: int) -> None:
    """The decode step of ``bench/llm_decode.py``'s Mistral-7B 8192/8192 keys (context bucket
    16,384, inf2 tp24: two heads' 16,384 scores per rank, a 64 KiB FP32 exp row per partition):
    a softmax stopped the compile with 'cannot place softmax.N.exp: needs 65536 bytes per
    partition but only 65408 (b1, three layers) / 54464 (b4) / 64640 (b1, six) are free' while
    two thirds of SBUF were free, split by the softmax's own statistics, the identity, or the
    scores and probabilities themselves; the last rows were then split (``split_softmax_rows``).
    Since the q/k/v projections share their input's transposes (``shared_stationary``, session
    11) the b1 rows found room unsplit, the b4 ones did not, and the figure depended on which
    (TPOT 8.56 -> 9.89 ms). Rows that wide are now always chunked (``SOFTMAX_CHUNK``), at b1 as
    at b4, whatever SBUF holds: 8 chunks of 2,048 per row tile, none narrowed for lack of room."""
    from neuroncore.compiler.lower_reduce import SOFTMAX_CHUNK

    program = _inf2_tp24_rank("llama-decode", "mistral-7b", layers=6, batch=batch, context=16383)
    assert program.stats["shared_stationary_dots"] > 0
    rows = program.stats["chunked_softmax_rows"]
    assert rows > 0 and program.stats["softmax_chunks"] == rows * 16384 // SOFTMAX_CHUNK
    assert "split_softmax_rows" not in program.stats


def test_llama2_70b_inf2_b4_prefill_compiles_when_a_dot_output_tile_finds_no_room() -> None:
    """Llama-2-70B's inf2 tp24 prefill of 4 x 128 tokens with three layers: layer 1's gate_proj
    (feature-major) held its previous k-block's weight block and transposed tokens for double
    buffering when its evacuation found no 1 KiB for an output tile, nor for a staging buffer;
    only a block's loads could fall back to single buffering, and the compile stopped ('cannot
    place silu.140.stage0: needs 1024 bytes per partition but only 832 are free')."""
    program = _inf2_tp24_rank("llama-prefill", "llama2-70b", layers=3, batch=4, context=128)
    assert program.stats["spilled_tiles"] > 0  # under SBUF pressure


def test_llama2_70b_inf2_b4_prefill_leaks_no_block_of_a_failed_double_buffered_load(monkeypatch) -> None:
    """The same prefill with 34 layers (the grid's 80 behave alike; ~5 CPU s, 28 layers relocated):
    layer 1's gate_proj found no room for a transposed token block's source tiles while holding
    the previous blocks. Before, the block was started again after releasing them and the first
    attempt's 16 KiB ``.T`` buffer was never freed (twice): layer 2's input_layernorm then found
    32,704 of the 32,768 bytes its square needed. Every ``.T`` buffer must be freed."""
    from neuroncore.compiler import context as ctx_module

    alloc, free = ctx_module.Context.alloc, ctx_module.Context.free
    live: dict[int, str] = {}

    def tracked_alloc(self, partitions, free_, dtype, name, **kwargs):
        buf = alloc(self, partitions, free_, dtype, name, **kwargs)
        live[buf.id] = name
        return buf

    def tracked_free(self, buf):
        live.pop(buf.id, None)
        free(self, buf)

    monkeypatch.setattr(ctx_module.Context, "alloc", tracked_alloc)
    monkeypatch.setattr(ctx_module.Context, "free", tracked_free)
    program = _inf2_tp24_rank("llama-prefill", "llama2-70b", layers=34, batch=4, context=128)
    assert program.stats["layers_relocated"] > 0
    assert not [name for name in live.values() if name.endswith(".T")]


def test_a_softmax_row_with_no_room_for_its_exp_is_split_into_column_chunks(
        monkeypatch, run, assert_close, rng) -> None:
    """When a softmax's whole FP32 exp row finds no free range (Mistral-7B's decode in bucket
    16,384 with six or more layers: 64,640 bytes the widest of 130,816 free), the row is computed
    in column chunks, each exp in its own buffer, the chunks' sums added after: the same results.
    The whole row's placement is refused here for every row tile."""
    from neuroncore.compiler import context as ctx_module
    from neuroncore.compiler.errors import CompileError

    b = nc.GraphBuilder("split_softmax")
    x = b.parameter("x", (2, 160, 1536), "fp32")
    g = b.build([b.softmax(x)])
    together = ctx_module.Context.alloc_together
    refused: list[str] = []

    def no_room_for_a_whole_row(self, requests):
        if any(name.endswith(".exp") for *_, name in requests):
            refused.append(requests[-1][3])
            raise CompileError("no room (test)", self.current_op)
        return together(self, requests)

    monkeypatch.setattr(ctx_module.Context, "alloc_together", no_room_for_a_whole_row)
    xs = (rng.standard_normal((2, 160, 1536)) * 4).astype(np.float32)
    res = run(g, [xs])
    assert len(refused) == 4 and res.program.stats["split_softmax_rows"] == 4  # 2 x 2 row tiles
    assert_close(res.out, res.ref, "fp32")
