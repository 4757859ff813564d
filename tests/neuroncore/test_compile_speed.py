"""Compile-speed machinery that must not change what is compiled or leak into the caller."""

from __future__ import annotations

import gc

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
