"""summary-text starts with a headline (device time, MFU, busiest engine, problems pointing at an op
kind); a dataset is one row per profile plus an aggregate, with ranks named."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from formats import figures as F
from formats import summary
from formats.profile_commands import main
from formats.reader import open_profile
from formats.units import fmt_ns, fmt_pct
from tests.fixtures.hand_profiles import write_tiny

SAMPLES = Path(__file__).resolve().parents[2] / "sample_profiles"
TP2 = SAMPLES / "llama-decode-tp2" / "device"


def _text(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["view", *args, "--output-format", "summary-text"]) == 0
    return capsys.readouterr().out


def test_headline_comes_first_and_uses_the_figures(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = write_tiny(tmp_path / "tiny")
    out = _text(capsys, str(path))
    lines = out.splitlines()
    assert lines[0].startswith("== tiny")
    head = "\n".join(lines[:lines.index("-- full table")])
    figs = F.figures(open_profile(path))
    assert f"device time     {fmt_ns(1000)}" in head
    assert f"MFU {fmt_pct(figs.mfu)}" in head
    assert "busiest engine  Tensor 25.0% (both Tensor rows)  · Vector 15.0%" in head
    assert "HBM             1000 B read, 2.0 KiB written" in head  # DMA packets' HBM side, not 0 B
    assert "collectives     1 ops, 100 ns, active 10.0%" in head
    # the full table follows, values as summary-json has them
    assert "mfu_estimated_percent" in out.split("-- full table")[1]


def test_problems_point_at_the_op_kind(capsys: pytest.CaptureFixture[str]) -> None:
    profile = TP2 / "model=llama_decode" / "core=0" / "execution=2"
    if not profile.exists():
        pytest.skip("sample profile not present")
    out = _text(capsys, str(profile))
    problems = [line for line in out.splitlines()[:14] if re.search(r"^(problems)?\s+[123]\. ", line)]
    assert problems and "→" in problems[0]
    # the summary's figure is semaphore-blocked time; "idle ... waiting on" is analyze's idle time by
    # cause, another figure (the rule said "idle waiting on DMA" from a guess the analysis could
    # contradict): one name per figure
    assert "Tensor engine blocked on semaphores" in problems[0] and "of it" in problems[0]
    assert "neuron-profile analyze" in problems[0] and "idle" not in problems[0]


def test_a_dataset_is_one_row_per_profile_and_an_aggregate(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    if not TP2.exists():
        pytest.skip("sample profile not present")
    root = tmp_path / "device"
    shutil.copytree(TP2, root)
    out = _text(capsys, str(root))
    lines = out.splitlines()
    assert lines[0] == "== 2 profiles =="
    rows = [line for line in lines if line.startswith("model=llama_decode/")]
    assert len(rows) == 2 and "rank 0 of 2 (core 0)" in rows[0] and "rank 1 of 2 (core 1)" in rows[1]
    total = next(line for line in lines if line.startswith("all "))
    stored = [summary.stored_summary(open_profile(p)) for p in sorted(root.glob("*/*/*"))]
    assert fmt_ns(sum(r["total_time"] for r in stored) * 1e9) in total  # Σ device time
    assert "-- full table" not in out and len(lines) < 30  # not one block per profile
    data = json.loads(_json(capsys, str(root)))
    assert len(data) == 2  # summary-json keeps every profile's full row


def test_long_profile_names_are_shown_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Generation captures name programs like model=<Model>.context_encoding.32/core=0/execution=2
    (over 60 characters): each row keeps its whole name (it was cut to '…del=...')."""
    if not TP2.exists():
        pytest.skip("sample profile not present")
    root = tmp_path / "device"
    shutil.copytree(TP2, root)
    long = "model=Qwen2ForCausalLM.context_encoding_with_a_long_bucket_name.32"
    (root / "model=llama_decode").rename(root / long)
    lines = _text(capsys, str(root)).splitlines()
    rows = [line for line in lines if line.startswith(f"{long}/core=")]
    assert len(rows) == 2 and not any("…" in line for line in lines)


def _json(capsys: pytest.CaptureFixture[str], path: str) -> str:
    assert main(["view", path, "--output-format", "summary-json"]) == 0
    return capsys.readouterr().out


def test_findings_point_at_the_kind_carrying_most_of_it(tmp_path: Path) -> None:
    from formats.attribution import attribute
    from formats.findings import find

    profile = open_profile(write_tiny(tmp_path / "tiny"))
    found = {f.title: f for f in find(profile, F.figures(profile), attribute(profile))}
    assert set(found) == {"Small DMA transfers", "Transposes dominating"}
    transposes = found["Transposes dominating"]
    assert (transposes.kind, transposes.share, transposes.op) == ("mlp", 1.0, "dot.1")
    assert "transposes are 20.0% of hardware FLOPs" in transposes.detail
    assert transposes.where == "mlp (100.0% of it, largest model/mlp, op dot.1)"
    small = found["Small DMA transfers"]
    assert small.share == 0.5 and "average transfer 1.5 KiB" in small.detail


def test_a_warm_up_execution_is_said_in_the_headline(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from tests.fixtures.hand_profiles import tiny_tables, write_profile

    path = write_profile(tmp_path / "warm", tiny_tables(),
                         metadata={"warm_up_execution": True, "requested_execution": 5})
    out = _text(capsys, str(path))
    assert out.splitlines()[1].startswith("note            warm-up execution:")
    assert "requested execution 5" in out.splitlines()[1]


def test_spill_reloads_and_small_transfers_follow_the_summary_viewer_rules(tmp_path: Path) -> None:
    import numpy as np

    from formats.attribution import attribute
    from formats.findings import find
    from tests.fixtures.hand_profiles import tiny_tables, write_profile

    tables = tiny_tables()
    tables["Instruction"]["spill_reload_bytes"] = np.array([0, 0, 0, 0, 0, 900])
    profile = open_profile(write_profile(tmp_path / "spill", tables))
    found = {f.title: f for f in find(profile, F.figures(profile), attribute(profile))}
    spill = found["Spill reloads"]
    assert spill.severity == 3 and spill.op == "tanh.3" and "= 90.0% of HBM reads" in spill.detail
    assert next(iter(found)) == "Spill reloads"  # biggest first
