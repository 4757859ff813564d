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
