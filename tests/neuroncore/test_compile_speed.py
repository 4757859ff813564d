"""Compile-speed machinery that must not change what is compiled or leak into the caller."""

from __future__ import annotations

import gc
import itertools

import numpy as np
import pytest

from neuroncore import workloads
from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler.errors import CompileError
from neuroncore.compiler.gc_pause import collector_paused


def test_compile_pauses_the_collector_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import neuroncore.compiler as compiler

    seen: list[bool] = []
    original = compiler.LOWERINGS["dot"]

    def spy(ctx, op):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        return original(ctx, op)

    monkeypatch.setitem(compiler.LOWERINGS, "dot", spy)
    graph = workloads.get("mlp").graph()
    was = gc.isenabled()
    try:
        gc.enable()
        compile_graph(graph, "trn1")
        assert seen and not any(seen)  # paused while lowering
        assert gc.isenabled()  # on again afterwards
        gc.disable()
        compile_graph(graph, "trn1")
        assert not gc.isenabled()  # a caller's own choice is kept
    finally:
        (gc.enable if was else gc.disable)()


def test_the_collector_comes_back_after_an_error_and_nested_pauses() -> None:
    was = gc.isenabled()
    try:
        gc.enable()
        with pytest.raises(CompileError), collector_paused():
            with collector_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the inner pause does not end the outer one
            raise CompileError("stop")
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def _in_generation(obj: object, generation: int) -> bool:
    return any(o is obj for o in gc.get_objects(generation))


def test_what_a_compile_keeps_goes_to_the_oldest_generation_without_a_pass() -> None:
    """The survivors of a paused compile (the program: hundreds of thousands of records) are moved
    into the oldest generation when the pause ends, not traversed by a young-generation pass (and
    later the middle one) that can find no cycle among them."""
    graph = workloads.get("llama-decode").graph(layers=2)
    was = gc.isenabled()
    try:
        gc.enable()
        compile_graph(graph, "trn1")  # imports and memos made once
        gc.collect()
        program = compile_graph(graph, "trn1")
        assert _in_generation(program, 2) and not _in_generation(program, 0)
        assert gc.get_count()[0] < 100  # no young pass pending over the compile's records
        with collector_paused():
            kept = [[i] for i in range(1000)]
        assert _in_generation(kept, 2) and _in_generation(kept[0], 2)
        # a caller's frozen objects stay frozen: then nothing is moved (the collector's own pass)
        frozen = [[0]]
        gc.freeze()
        try:
            count = gc.get_freeze_count()
            with collector_paused():
                later = [[i] for i in range(10)]
            assert gc.get_freeze_count() == count and not _in_generation(frozen, 2)
            assert not _in_generation(later, 2)
        finally:
            gc.unfreeze()
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("name", ["llama-decode", "llama-prefill", "bert-layer"])
def test_a_compile_leaves_no_reference_cycle(name: str) -> None:
    """What a compile leaves goes straight to the oldest generation, where a cycle waits for the
    next full collection: so a compile must leave none (an unread view's closure once held the
    whole context: context -> value -> closure -> context)."""
    graph = workloads.get(name).graph(layers=2) if name.startswith("llama") else \
        workloads.get(name).graph()
    compile_graph(graph, "trn1")  # imports and memos made once
    was = gc.isenabled()
    gc.disable()  # no automatic pass: a cycle stays for the count below
    try:
        gc.collect()
        program = compile_graph(graph, "trn1")
        assert gc.collect() == 0  # nothing the compile dropped was kept alive by a cycle
        del program
        assert gc.collect() == 0  # nor is the program itself a cycle
    finally:
        (gc.enable if was else gc.disable)()


def test_fast_init_records_are_the_dataclass_records() -> None:
    """fast_init replaces a frozen slotted record's __init__; the records it makes must equal the
    generated __init__'s, stay frozen, and refuse wrong arguments the same way."""
    import dataclasses
    from dataclasses import dataclass

    from neuroncore.compiler.counters import NodeCounters
    from neuroncore.compiler.fast_init import fast_init
    from neuroncore.compiler.lowering_state import Layout
    from neuroncore.compiler.program import HbmAccess, Ref

    @dataclass(frozen=True, slots=True)
    class Plain:
        a: int
        b: str = "x"
        c: Layout = Layout.ROW

    @dataclass(frozen=True, slots=True)
    class Fast:
        a: int
        b: str = "x"
        c: Layout = Layout.ROW

    assert fast_init(Fast) is Fast and Fast.__init__ is not Plain.__init__
    for args, kwargs in [((1,), {}), ((1, "y"), {}), ((1,), {"c": Layout.COL}), ((), {"a": 2, "b": "z"})]:
        plain, fast = Plain(*args, **kwargs), Fast(*args, **kwargs)
        assert dataclasses.astuple(plain) == dataclasses.astuple(fast)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Fast(1).a = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        Fast()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Fast(1, bogus=2)  # type: ignore[call-arg]

    # the compiler's records carry it, and make the same values as before
    assert NodeCounters(sbuf_read_bytes=5, raw_flops=3).as_tuple() == (3, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0)
    assert Ref(1, 2, 3, 4, 5) == Ref(buf=1, p0=2, p1=3, f0=4, f1=5) and Ref(1, 2, 3, 4, 5).cols == 1
    assert HbmAccess("t", 0, 1, 2, 3, 4).layout is Layout.ROW
    with pytest.raises(TypeError):
        NodeCounters(sbuf_reads_bytes=1)  # type: ignore[call-arg]  # a misspelt counter still fails

    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    original = Checked.__init__
    assert fast_init(Checked).__init__ is original  # a __post_init__ keeps the generated __init__


def _random_hbm_program(em, seed: int) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """Nodes on a few lanes reading and writing random rectangles of two HBM keys (tile-like
    rectangles, repeats of one rectangle, wide ones, whole-tensor ones); each node's dependencies."""
    import random

    from neuroncore.compiler.emitter import WHOLE_TENSOR
    from neuroncore.compiler.node_semantics import NOP
    from neuroncore.hardware import Engine

    rng = random.Random(seed)
    rects: list[tuple[int, int, int, int]] = []
    for _ in range(40):
        r0, c0 = rng.randrange(0, 2048, 16), rng.randrange(0, 4096, 64)
        rects.append((r0, r0 + rng.choice([1, 12, 128, 200]), c0, c0 + rng.choice([1, 64, 512, 700])))
    rects += [(0, 4096, 0, 64), (0, 1, 0, 1 << 20), WHOLE_TENSOR]
    for _ in range(400):
        key = ("hbm", rng.choice(["a", "b"]))
        rect = rng.choice(rects) if rng.random() < 0.97 else WHOLE_TENSOR
        engine = rng.choice([Engine.SYNC, Engine.VECTOR, Engine.GPSIMD, Engine.TENSOR])
        if rng.random() < 0.5:
            reads, writes = [(key, rect)], []
        else:
            reads, writes = [], [(key, rect)]
        em.instruction(engine, "X", 1.0, reads=reads, writes=writes, text="", semantics=NOP)
    return [list(d) for d in em.deps]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_area_index_gives_the_dependencies_of_a_plain_scan(monkeypatch: pytest.MonkeyPatch,
                                                           seed: int) -> None:
    """An HBM key's area index (emitter._Index) must give every node the dependencies scanning
    the key's whole lists gives, whatever the mix of reads, writes, covers and whole-tensor
    accesses; and hazards_for (NKI) every overlapping node, not only each lane's latest."""
    from neuroncore.compiler import emitter

    monkeypatch.setattr(emitter, "INDEX_MIN", 1 << 30)
    plain = emitter.Emitter()
    expected = _random_hbm_program(plain, seed)
    monkeypatch.setattr(emitter, "INDEX_MIN", 2)
    indexed = emitter.Emitter()
    assert _random_hbm_program(indexed, seed) == expected
    assert any(getattr(a, "ix", None) is not None for a in indexed._accesses.values())  # index used
    whole = [(("hbm", "a"), emitter.WHOLE_TENSOR)]
    assert indexed.hazards_for(-1, [], whole) == plain.hazards_for(-1, [], whole)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_area_index_keeps_the_access_lists_of_a_plain_scan(monkeypatch: pytest.MonkeyPatch,
                                                           seed: int) -> None:
    """Reads an access covers leave an indexed key's read list in place (``_drop_covered``): the
    lists left, in their order and under their keys, are the ones rebuilding gives (no index)."""
    from neuroncore.compiler import emitter

    monkeypatch.setattr(emitter, "INDEX_MIN", 1 << 30)
    plain = emitter.Emitter()
    _random_hbm_program(plain, seed)
    monkeypatch.setattr(emitter, "INDEX_MIN", 2)
    indexed = emitter.Emitter()
    _random_hbm_program(indexed, seed)
    for key, accesses in plain._accesses.items():
        other = indexed._adopt(key)
        assert other.w == accesses.w
        assert list(other.r.items()) == list(accesses.r.items())


def test_a_covering_read_of_an_indexed_key_does_not_rebuild_its_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A long prompt's normalised activations (an HBM key read row tile by row tile, thousands of
    reads) were rebuilt whole each time a read covered an earlier one of its lane: quadratic in
    the prompt. Now only the covered reads leave the list."""
    from neuroncore.compiler import emitter
    from neuroncore.compiler.node_semantics import NOP
    from neuroncore.hardware import Engine

    em = emitter.Emitter()
    key = ("hbm", "x")
    for lane_engine in (Engine.SYNC, Engine.GPSIMD):
        for r0 in range(0, 256 * 128, 128):
            em.instruction(lane_engine, "X", 1.0, reads=[(key, (r0, r0 + 128, 0, 1024))], writes=[],
                           text="", semantics=NOP)
    accesses = em._adopt(key)
    assert accesses.ix is not None and len(accesses.r) == 512
    rebuilt: list[int] = []
    original = emitter._reads_of
    monkeypatch.setattr(emitter, "_reads_of", lambda entries: rebuilt.append(1) or original(entries))
    # a wider read on the first lane covers two of its reads (not the other lane's)
    em.instruction(Engine.SYNC, "X", 1.0, reads=[(key, (0, 256, 0, 1024))], writes=[], text="",
                   semantics=NOP)
    assert rebuilt == []
    assert len(accesses.r) == 511
    assert list(accesses.r)[-1] == (0, 256, 0, 1024, int(Engine.SYNC))
    # a write covering a row tile removes both lanes' reads of it
    em.instruction(Engine.VECTOR, "X", 1.0, reads=[], writes=[(key, (256, 384, 0, 1024))], text="",
                   semantics=NOP)
    assert rebuilt == [] and len(accesses.r) == 509


def test_area_index_compiles_the_same_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compile with every HBM key indexed from its second entry is the program of one with no
    index at all (every column, operand string and record: the fingerprint digest)."""
    import importlib.util
    from pathlib import Path

    from neuroncore.compiler import emitter
    from neuroncore.workloads import train_graphs as tg

    path = Path(__file__).parents[2] / "bench" / "compile_fingerprint.py"
    spec = importlib.util.spec_from_file_location("compile_fingerprint", path)
    assert spec is not None and spec.loader is not None
    fingerprint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fingerprint)
    model = tg.Transformer("tiny-vit", layers=1, hidden=128, heads=4, kv_heads=4, intermediate=256,
                           vocab=768, norm="layer", mlp="gelu", bias=True, causal=False, rope=False)
    graph = tg.layer_forward(model, tg.RankShapes.of(model, 8, 40, 1), 1)
    monkeypatch.setattr(emitter, "INDEX_MIN", 1 << 30)
    plain = fingerprint.digest(compile_graph(graph, "trn1"))
    monkeypatch.setattr(emitter, "INDEX_MIN", 2)
    assert fingerprint.digest(compile_graph(graph, "trn1")) == plain


def test_shared_counters_are_the_records_the_constructor_makes() -> None:
    """shared_counters(*values) is NodeCounters(*values), one record per distinct values."""
    from neuroncore.compiler.counters import NodeCounters, shared_counters

    a = shared_counters(0, 0, 0, 0, 0, 256, 0, 0, 512)
    assert a == NodeCounters(sbuf_read_bytes=256, psum_write_bytes=512)
    assert shared_counters(0, 0, 0, 0, 0, 256, 0, 0, 512) is a
    assert shared_counters(0, 0, 0, 0, 0, 256, 0, 0, 1024) != a


def _random_onchip_program(em, seed: int, check: bool = False) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """Nodes on the engines and both Tensor tracks reading and writing column blocks of on-chip
    buffers that are freed and reallocated over each other's ranges (each new buffer inherits its
    range's previous users, as ``Context.alloc`` and ``alloc_psum`` make it), with whole-buffer
    writes covering what a buffer inherited, and LoadStationary nodes waited for through the
    MultiplyMoving after them. With ``check``, each node's dependencies are compared, before the
    next node, with the definition: every overlapping earlier access (``hazards_for``), each
    LoadStationary mapped to its MultiplyMoving (``ls_alias``), then each lane's latest
    (``compact``). Returns each node's dependencies."""
    import random

    from neuroncore.compiler.emitter import RES_TENSOR_LS, RES_TENSOR_MM, WHOLE_BUFFER
    from neuroncore.compiler.node_semantics import NOP
    from neuroncore.hardware import Engine

    rng = random.Random(seed)
    slots: dict[int, list[int]] = {s: [] for s in range(6)}  # a range: its previous users' nodes
    live: dict[int, int] = {}  # range -> buffer id
    next_id = 0
    for _ in range(1500):
        roll = rng.random()
        if roll < 0.06 or not live:  # (re)allocate a range: the new buffer inherits its users
            slot = rng.randrange(6)
            if slot in live:
                slots[slot] = em.forget(("buf", live.pop(slot)))
            live[slot] = next_id
            em.inherit(("buf", next_id), WHOLE_BUFFER, slots[slot], compacted=rng.random() < 0.5)
            next_id += 1
            continue
        key = ("buf", live[rng.choice(sorted(live))])
        c0 = rng.randrange(0, 64) * 128
        width = rng.choice([128, 128, 128, 512, 1 << 40])
        rect = (0, 128, 0, 1 << 40) if width == 1 << 40 else (0, rng.choice([64, 128]), c0, c0 + width)
        track, engine = rng.choice([(RES_TENSOR_LS, Engine.TENSOR), (RES_TENSOR_MM, Engine.TENSOR),
                                    (None, Engine.VECTOR), (None, Engine.SCALAR), (None, Engine.GPSIMD)])
        if track == RES_TENSOR_LS:
            reads, writes = [(key, rect)], []
        elif rng.random() < 0.5:
            reads, writes = [(key, rect)], [(("buf", live[rng.choice(sorted(live))]), rect)]
        else:
            reads, writes = [], [(key, rect)]
        extra = {rng.randrange(em.n_nodes)} if em.n_nodes and rng.random() < 0.05 else None
        lane = track if track is not None else int(engine)
        if check:
            found = em.hazards_for(lane, reads, writes) | {d for d in extra or () if em.lane_of(d) != lane}
            expected = em.compact({em.ls_alias(d) for d in found})
        node = em.instruction(engine, "X", 1.0, reads=reads, writes=writes, text="", semantics=NOP,
                              track=track, extra_deps=extra)
        if check:
            assert em.deps[node] == expected, node
    return [list(d) for d in em.deps]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dependencies_are_each_lanes_latest_of_every_overlapping_access(seed: int) -> None:
    """A node's dependencies, whose inherited part is merged from per-lane maps made once per
    buffer and lane (``_Accesses.base_map``), are what their definition gives: compacting every
    overlapping earlier access's node, LoadStationary nodes mapped to their MultiplyMoving."""
    from neuroncore.compiler import emitter

    _random_onchip_program(emitter.Emitter(), seed, check=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_column_index_gives_the_dependencies_of_a_plain_scan(monkeypatch: pytest.MonkeyPatch,
                                                             seed: int) -> None:
    """An on-chip key's column index (``emitter._Columns``) gives every node the dependencies, and
    leaves every key the access lists, that scanning the key's whole write list does."""
    from neuroncore.compiler import emitter

    monkeypatch.setattr(emitter, "COLUMNS_MIN", 1 << 30)
    plain = emitter.Emitter()
    expected = _random_onchip_program(plain, seed)
    monkeypatch.setattr(emitter, "COLUMNS_MIN", 2)
    indexed = emitter.Emitter()
    assert _random_onchip_program(indexed, seed) == expected
    assert any(getattr(a, "cx", None) is not None for a in indexed._accesses.values())  # index used
    assert indexed._accesses.keys() == plain._accesses.keys()
    for key, accesses in plain._accesses.items():
        assert list(indexed._accesses[key]) == list(accesses)


def test_column_index_compiles_the_same_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compile with every on-chip key's writes indexed from the second is the program of one
    with no column index (the fingerprint digest: every column, operand string and record)."""
    import importlib.util
    from pathlib import Path

    from neuroncore.compiler import emitter

    path = Path(__file__).parents[2] / "bench" / "compile_fingerprint.py"
    spec = importlib.util.spec_from_file_location("compile_fingerprint", path)
    assert spec is not None and spec.loader is not None
    fingerprint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fingerprint)
    graph = workloads.get("llama-prefill").graph(layers=1, context=512)
    monkeypatch.setattr(emitter, "COLUMNS_MIN", 1 << 30)
    plain = fingerprint.digest(compile_graph(graph, "trn1"))
    monkeypatch.setattr(emitter, "COLUMNS_MIN", 2)
    assert fingerprint.digest(compile_graph(graph, "trn1")) == plain


def _plain_moves(em, values: np.ndarray, ptr: np.ndarray | None) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The relocated ranges' node ids moved by the plain definition (``Emitter._apply_moves``)."""
    values = values.copy()
    for start, stop, lo, dn, _ in em.dep_moves:
        segment = values[ptr[start]:ptr[stop]] if ptr is not None else values[start:stop]
        segment[segment >= lo] += dn
    return values


@pytest.mark.parametrize("name, overrides", [
    ("llama-decode", {"layers": 8}),
    ("llama-prefill", {"layers": 10, "context": 128}),
])
def test_relocated_moves_are_the_plain_definition(monkeypatch: pytest.MonkeyPatch, name: str,
                                                  overrides: dict[str, int]) -> None:
    """A relocated layer's dependencies and triggers, moved with its template's mask shared by
    every relocation, are what moving each range's own ids at or past ``lo`` gives."""
    from neuroncore import compiler
    from neuroncore.compiler.emitter import DEP_IDX_DTYPE

    seen = []
    assemble = compiler.assemble

    def spy(em, *args, **kwargs):  # type: ignore[no-untyped-def]
        dep_ptr, flat = em.dep_columns()
        n = len(em.deps)
        unmoved = np.fromiter(itertools.chain.from_iterable(em.deps), DEP_IDX_DTYPE)
        ptr = np.zeros(n + 1, np.int64)
        np.cumsum([len(d) for d in em.deps], out=ptr[1:])
        assert np.array_equal(dep_ptr, ptr)
        assert np.array_equal(flat, _plain_moves(em, unmoved, ptr))
        plain = _plain_moves(em, np.array(em.trigger, np.int64), None)  # a copy: trigger_column
        assert np.array_equal(em.trigger_column(), plain)  # may move the emitter's array in place
        seen.append(len(em.dep_moves))
        return assemble(em, *args, **kwargs)

    monkeypatch.setattr(compiler, "assemble", spy)
    compile_graph(workloads.get(name).graph(**overrides), "trn1")
    assert seen and seen[0] >= 2  # layers were relocated (a template shared)


@pytest.mark.parametrize("seed", range(4))
def test_stream_counts_loop_is_the_sorted_definition(seed: int) -> None:
    """The compiled loops (big programs) give the arrays the stable sort gives: each node's place
    in its stream, each producer's running count on its semaphore (DMA transfers counting 16)."""
    from neuroncore.compiler import stream_counts

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    keys = rng.choice(np.asarray([0, 1, 2, 3, 4, 50, 100, 101, 117], np.int16), n)
    assert np.array_equal(stream_counts.stream_positions_loop(keys),
                          stream_counts.stream_positions_sorted(keys))
    sem = rng.choice(np.asarray([-1, -1, 0, 1, 2, 3, 5, 8, 9, 23], np.int16), n)
    dma = rng.random(n) < 0.3
    loop = stream_counts.semaphore_values_loop(sem, dma, 16)
    assert loop.dtype == np.int32
    assert np.array_equal(loop, stream_counts.semaphore_values_sorted(sem, dma, 16))
    assert not loop[sem < 0].any() and (loop[sem >= 0] > 0).all()
    none = np.full(n, -1, np.int16)
    assert np.array_equal(stream_counts.semaphore_values_loop(none, dma, 16), np.zeros(n, np.int32))


def test_stream_counts_loop_compiles_the_same_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program assembled with the compiled loops is the program of the sorted definition (every
    column, operand string and record: the fingerprint digest)."""
    import importlib.util
    from pathlib import Path

    from neuroncore.compiler import stream_counts

    path = Path(__file__).parents[2] / "bench" / "compile_fingerprint.py"
    spec = importlib.util.spec_from_file_location("compile_fingerprint", path)
    assert spec is not None and spec.loader is not None
    fingerprint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fingerprint)
    graph = workloads.get("llama-prefill").graph(layers=6, context=16)
    monkeypatch.setattr(stream_counts, "LOOP_MIN_NODES", 1 << 62)
    plain = fingerprint.digest(compile_graph(graph, "trn1"))
    monkeypatch.setattr(stream_counts, "LOOP_MIN_NODES", 0)
    assert fingerprint.digest(compile_graph(graph, "trn1")) == plain
