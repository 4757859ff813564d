"""The Perfetto export: nesting with zero-length slices, the flows that explain waiting, the layer and HLO
op tracks with the args a user looks for, streaming in time slices, and output files never written
through a link. Each trace is read back as trace_processor reads it (``perfetto_trace.read_trace``)."""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from formats import trace_export
from formats.profile_commands import main
from formats.reader import open_profile
from formats.recorder import metadata_from_spec
from formats.writer import ProfileWriter
from neuroncore.hardware import NC_V2
from tests.fixtures.perfetto_trace import Trace, read_trace
from tests.fixtures.recorded import Recorded

TRACKS = ["Tensor", "Vector"]


def _profile(path: Path, rows: list[tuple[str, int, int, str]]) -> Path:
    """A profile whose Instruction table holds ``rows`` (track, start, end, opcode), ids in order."""
    n = len(rows)
    track = pa.array([TRACKS.index(r[0]) for r in rows], pa.int8())
    with ProfileWriter(path, {**metadata_from_spec(NC_V2), "is_simulation": True, "profile_name": "z"}) as w:
        w.write("Instruction", {
            "start_ts": np.array([r[1] for r in rows], np.int64),
            "end_ts": np.array([r[2] for r in rows], np.int64),
            "duration_ns": np.array([r[2] - r[1] for r in rows], np.int64),
            "engine": pa.DictionaryArray.from_arrays(track, pa.array(TRACKS)),
            "timeline_track": pa.DictionaryArray.from_arrays(track, pa.array(TRACKS)),
            "opcode": pa.array([r[3] for r in rows]), "id": np.arange(n, dtype=np.int64),
            "pc": np.arange(n, dtype=np.int64), "bir_id": pa.array([f"sg0000:{i}" for i in range(n)]),
            "operands": pa.array([f"op{i}" for i in range(n)]),
            "pcore_idx": np.zeros(n, np.int64), "evt_wait_time_ns": np.zeros(n, np.int64),
        })
    return path


def _export(profile: Path, target: Path, *extra: str) -> Trace:
    assert main(["view", str(profile), "--output-format", "perfetto", "-o", str(target), *extra]) == 0
    return read_trace(target)


def test_zero_duration_slices_open_before_they_close(tmp_path: Path) -> None:
    """A zero-length instruction at the timestamp where the previous one ends and the next begins used
    to be written END before BEGIN, closing its neighbour instead and un-nesting every later slice."""
    rows = [("Tensor", 0, 10, "MATMUL"), ("Tensor", 10, 10, "NOP"), ("Tensor", 10, 20, "MATMUL"),
            ("Tensor", 20, 20, "NOP"), ("Tensor", 20, 20, "NOP"), ("Tensor", 20, 30, "MATMUL"),
            ("Vector", 5, 5, "IOTA"), ("Vector", 5, 15, "TENSOR_TENSOR"), ("Vector", 15, 15, "NOP")]
    trace = _export(_profile(tmp_path / "z", rows), tmp_path / "z.pftrace")
    tensor = [(s.ts, s.dur, s.name, s.depth) for s in trace.on("Tensor")]
    assert tensor == [(0, 10, "MATMUL", 0), (10, 0, "NOP", 0), (10, 10, "MATMUL", 0), (20, 0, "NOP", 0),
                      (20, 0, "NOP", 0), (20, 10, "MATMUL", 0)]
    assert [(s.ts, s.dur, s.depth) for s in trace.on("Vector")] == [(5, 0, 0), (5, 10, 0), (15, 0, 0)]
    assert set(trace.count()) == {"Tensor", "Vector"}  # no lanes were needed


def _flow_ends(trace: Trace) -> tuple[dict[int, tuple[str, int]], dict[int, tuple[str, int]]]:
    """flow id -> (table, id) of the slice it leaves from / arrives at."""
    def node(track: str, args: dict[str, Any]) -> tuple[str, int]:
        return ("dma_block" if track.startswith("q") else "instruction", args["id"])

    out = {f: node(s.track, s.args) for s in trace.slices for f in s.flows_out}
    into = {f: node(s.track, s.args) for s in trace.slices for f in s.flows_in}
    return out, into


def test_default_flows_are_the_waits_all_flows_on_request(recorded: Recorded, tmp_path: Path) -> None:
    profile = open_profile(recorded.path)
    flow = profile.table("Flow", ["in_table", "in_id", "out_table", "out_id"]).to_pylist()
    instr = profile.table("Instruction", ["id", "end_ts", "evt_wait_time_ns"]).to_pylist()
    ends = {("instruction", r["id"]): r["end_ts"] for r in instr}
    packets = profile.table("DmaPacket", ["packet_aggregation_id", "end_ts"]).to_pylist()
    for p in packets:
        key = ("dma_block", p["packet_aggregation_id"])
        ends[key] = max(ends.get(key, 0), p["end_ts"])
    waited = {r["id"] for r in instr if r["evt_wait_time_ns"] > 0}
    incoming: dict[tuple[str, int], list[tuple[str, int]]] = collections.defaultdict(list)
    for e in flow:
        incoming[(e["out_table"], e["out_id"])].append((e["in_table"], e["in_id"]))
    assert max(len(v) for v in incoming.values()) > 1  # the profile has targets with several edges

    everything = _export(recorded.path, tmp_path / "all.pftrace", "--all-flows")
    assert everything.flows == (len(flow), len(flow))
    src, dst = _flow_ends(everything)
    assert sorted((src[f], dst[f]) for f in src) == sorted(
        ((e["in_table"], e["in_id"]), (e["out_table"], e["out_id"])) for e in flow)

    trace = _export(recorded.path, tmp_path / "waits.pftrace")
    src, dst = _flow_ends(trace)
    assert set(src) == set(dst) and 0 < len(src) < len(flow)
    targets = collections.Counter(dst.values())
    assert max(targets.values()) == 1  # at most one arrow into each instruction / transfer
    for fid, target in dst.items():
        if target[0] == "instruction":
            assert target[1] in waited  # an instruction that did not wait gets no arrow
        # the arrow is the wait it sat in: the incoming edge whose source ended last
        assert ends[src[fid]] == max(ends[s] for s in incoming[target])
    expected = {t for t, sources in incoming.items() if t[0] == "dma_block" or t[1] in waited}
    assert set(targets) == expected


def test_layer_and_op_tracks_and_instruction_args(recorded: Recorded, tmp_path: Path) -> None:
    trace = _export(recorded.path, tmp_path / "bert.pftrace")
    profile = open_profile(recorded.path)
    table = profile.table("Instruction", ["id", "hlo_name", "layer", "operands", "evt_wait_time_ns",
                                          "hbm_read_bytes", "bir_debug_info_source_location"]).to_pylist()
    by_id = {r["id"]: r for r in table}
    checked = 0
    for s in trace.slices:
        if s.track.split(" #")[0] in ("Tensor", "TensorMatrix", "Vector", "Scalar", "GpSimd", "Sync"):
            row = by_id[s.args["id"]]
            assert s.args.get("hlo") == row["hlo_name"] and s.args.get("layer") == row["layer"]
            assert s.args.get("operands") == row["operands"]
            assert s.args["semaphore_wait_ns"] == row["evt_wait_time_ns"]
            assert s.args["hbm_read_bytes"] == row["hbm_read_bytes"]
            assert s.args.get("source") == row["bir_debug_info_source_location"]
            checked += 1
    assert checked == len(table)
    # the tracks above the engines, in order: Layers, HLO ops, then the engine rows
    by_name = {name: uuid for uuid, name in trace.names.items()}
    assert trace.ranks[by_name["Layers"]] < trace.ranks[by_name["HLO ops"]] < trace.ranks[by_name["Tensor"]]
    ops = [s for s in trace.slices if s.track.startswith("HLO ops")]
    hlo = profile.table("HloInstruction", ["hlo_name", "start_ts", "end_ts"]).to_pylist()
    assert sorted((s.name, s.ts, s.ts + s.dur) for s in ops) == sorted(
        (r["hlo_name"], r["start_ts"], r["end_ts"]) for r in hlo)
    assert all(s.args.get("layer") for s in ops)
    layers = [s for s in trace.slices if s.track.startswith("Layers")]
    roots = {s.args["layer"] for s in layers if s.depth == 0 and "/" not in s.args["layer"]}
    assert roots == {"encoder"}
    for s in layers:  # every layer slice sits inside its parent's slice of the same execution
        path = s.args["layer"]
        if "/" in path:
            parent = path.rsplit("/", 1)[0]
            assert any(p.args["layer"] == parent and p.args["execution"] == s.args["execution"]
                       and p.ts <= s.ts and s.ts + s.dur <= p.ts + p.dur for p in layers)
            if s.depth:  # nested on its own lane: directly inside the parent there
                assert s.name == path.rsplit("/", 1)[1]


def _content(trace: Trace) -> list[tuple[Any, ...]]:
    return sorted((s.track.split(" #")[0], s.ts, s.dur, s.name, sorted(s.args.items()), len(s.flows_out),
                   len(s.flows_in)) for s in trace.slices)


def test_time_slices_and_interning_resets_give_the_same_trace(recorded: Recorded, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Streamed in many small time slices (ends carried across them), encoded in small chunks, with the
    interned strings reset several times: the same slices, args and flows as one pass."""
    whole = _export(recorded.path, tmp_path / "whole.pftrace")
    monkeypatch.setattr(trace_export, "WINDOW_ROWS", 50)
    monkeypatch.setattr(trace_export, "CHUNK_EVENTS", 37)
    monkeypatch.setattr(trace_export, "INTERN_LIMIT", 40)
    sliced = _export(recorded.path, tmp_path / "sliced.pftrace")
    assert _content(sliced) == _content(whole)
    assert sliced.counters == whole.counters


def test_output_never_follows_a_link(recorded: Recorded, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    target = tmp_path / "out.pftrace"
    os.symlink(victim, f"{target}.partial")  # the staging name another user could guess
    assert main(["view", str(recorded.path), "--output-format", "perfetto", "-o", str(target)]) == 0
    assert victim.read_text() == "keep me" and read_trace(target).slices
    assert os.path.islink(f"{target}.partial")  # left alone, not written through or removed
    capsys.readouterr()

    link = tmp_path / "link.pftrace"
    os.symlink(victim, link)
    assert main(["view", str(recorded.path), "--output-format", "perfetto", "-o", str(link)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "symbolic link" in err[0]
    assert victim.read_text() == "keep me"
    for fmt in ("json", "summary-text"):
        assert main(["view", str(recorded.path), "--output-format", fmt, "-o", str(link)]) == 2
        assert victim.read_text() == "keep me"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial") and not p.startswith("out.")]


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet", "table"])
def test_query_output_never_follows_a_link(recorded: Recorded, tmp_path: Path, fmt: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / f"result.{fmt}"
    os.symlink(victim, link)
    sql = "SELECT opcode, count(*) AS n FROM Instruction GROUP BY 1"
    assert main(["query", str(recorded.path), sql, "--format", fmt, "-o", str(link)]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "keep me"
    plain = tmp_path / f"plain.{fmt}"
    assert main(["query", str(recorded.path), sql, "--format", fmt, "-o", str(plain)]) == 0
    assert plain.stat().st_size > 0 and not plain.is_symlink()
    assert [p.name for p in tmp_path.iterdir() if ".partial" in p.name] == []
