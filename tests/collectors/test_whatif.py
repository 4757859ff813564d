"""``neuron-profile analyze --what-if``: a re-simulation equals a fresh capture with the changed option,
findings carry the measured gain, and a profile that cannot be re-run says so in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CLI = [sys.executable, "-m", "explorer.profile_cli"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


def _capture(out: Path, *extra: str) -> Path:
    done = _run("capture", "--workload", "bert-layer", "--instance", "trn1.2xlarge", "--timing-only",
                "--device-only", "--num-exec", "1", "--profile-nth-exec", "1", "-o", str(out), *extra)
    assert done.returncode == 0, done.stderr
    return out


def _device_time(root: Path) -> int:
    done = _run("analyze", str(root / "device"), "--output-format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    return int(data["device_time_ns"])


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _capture(tmp_path_factory.mktemp("whatif") / "bert")


def test_capture_leaves_rerun_facts(captured: Path) -> None:
    facts = json.loads((captured / "rerun.json").read_text())
    assert facts["format"] == "neuronscope-rerun/1" and facts["workload"] == "bert-layer"
    assert facts["instance"] == "trn1.2xlarge" and facts["timing_only"] is True


def test_what_if_equals_a_fresh_capture_with_the_change(captured: Path, tmp_path: Path) -> None:
    done = _run("analyze", str(captured / "device"), "--output-format", "json",
                "--what-if", "dma-bandwidth=2", "--what-if", "batch=2")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    by_change = {w["change"]: w for w in data["what_if"]}
    before = _device_time(captured)
    assert by_change["dma-bandwidth=2"]["device_time_ns"]["before"] == before
    fresh_dma = _device_time(_capture(tmp_path / "dma", "--scale-hardware", "dma_engine_bytes_per_s=2"))
    fresh_batch = _device_time(_capture(tmp_path / "batch", "--set", "batch=2"))
    assert by_change["dma-bandwidth=2"]["device_time_ns"]["after"] == fresh_dma < before
    assert by_change["batch=2"]["device_time_ns"]["after"] == fresh_batch > before
    assert "--scale-hardware dma_engine_bytes_per_s=2" in by_change["dma-bandwidth=2"]["capture"]
    # the DMA-queue finding carries the gain that was measured
    gains = [f["gain_ns"] for f in data["findings"] if f["title"].startswith("DMA queue")]
    assert gains and gains[0] == before - fresh_dma


def test_what_if_needs_a_rerunnable_capture(tmp_path: Path) -> None:
    from tests.fixtures.hand_profiles import write_tiny

    root = write_tiny(tmp_path / "tiny", summary=False)
    done = _run("analyze", str(root), "--what-if", "dma-bandwidth=2")
    assert done.returncode == 2
    assert "no rerun.json" in done.stderr and done.stderr.count("\n") == 1


def test_bad_what_if_is_one_line(captured: Path) -> None:
    done = _run("analyze", str(captured / "device"), "--what-if", "nonsense")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "NAME=VALUE" in done.stderr
    done = _run("capture", "--workload", "bert-layer", "--scale-hardware", "warp_speed=9", "-o",
                str(captured.parent / "bad"))
    assert done.returncode == 2 and "--scale-hardware" in done.stderr and done.stderr.count("\n") == 1


# -- Trainium2 power throttling: recorded, reported with its cost, and re-simulated without it -------


def _capture_mlp(out: Path, instance: str, *extra: str) -> Path:
    done = _run("capture", "--workload", "mlp", "--instance", instance, "--timing-only", "--device-only",
                "--num-exec", "1", "--profile-nth-exec", "1", "-o", str(out), *extra)
    assert done.returncode == 0, done.stderr
    return out


def _throttle_rows(root: Path) -> list[dict[str, Any]]:
    from formats.dataset import find_profiles
    from formats.reader import open_profile

    (entry,) = find_profiles(root / "device")[0]
    profile = open_profile(entry.path)
    if not profile.num_rows("Throttle"):
        return []
    return profile.table("Throttle", ["timestamp", "duration", "k", "n", "type"]).to_pylist()


@pytest.fixture(scope="module")
def trn2_mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _capture_mlp(tmp_path_factory.mktemp("throttle") / "mlp", "trn2.48xlarge")


def test_a_trn2_capture_records_throttling_and_analyze_reports_its_cost(trn2_mlp: Path) -> None:
    rows = _throttle_rows(trn2_mlp)
    assert rows and all(r["k"] == 1 and r["n"] == 2 and r["type"] == "activity_0" and r["duration"] > 0
                        for r in rows)
    assert json.loads((trn2_mlp / "rerun.json").read_text())["power_throttling"] is True
    from formats import validate
    from formats.dataset import find_profiles

    report = validate(find_profiles(trn2_mlp / "device")[0][0].path)  # Throttle rows as the schema says
    assert report.conformant, "\n".join(report.lines())
    done = _run("analyze", str(trn2_mlp / "device"))
    assert done.returncode == 0, done.stderr
    assert "Power throttling" in done.stdout
    assert f"{len(rows)} throttling periods" in done.stdout and "matmuls ran" in done.stdout


def test_a_throttled_profile_carries_its_throttle_summary(trn2_mlp: Path) -> None:
    """ThrottleSummary (profile-schema §3.5), written at close from formats.throttling's periods:
    time throttled, its share of total_time and the time-weighted utilisation cap; conformant to the
    reference schema JSON when it is present."""
    from formats import open_profile, validate
    from formats.dataset import find_profiles
    from formats.schema import Schema, reference_json_path

    rows = _throttle_rows(trn2_mlp)
    (entry,) = find_profiles(trn2_mlp / "device")[0]
    profile = open_profile(entry.path)
    (summary,) = profile.table("ThrottleSummary").to_pylist()
    total_ns = profile.table("Summary", ["total_time"]).to_pylist()[0]["total_time"] * 1e9
    throttled = sum(r["duration"] for r in rows)  # the core's periods never overlap
    assert summary["nc_idx"] == 0 and summary["throttle_type"] == "activity_0"
    assert summary["throttle_active_time_ns"] == throttled
    assert summary["throttle_active_time_percent"] == pytest.approx(throttled / total_ns, rel=1e-4)
    lost = sum(r["duration"] * (1 - r["k"] / r["n"]) for r in rows)
    assert summary["max_achievable_util_with_throttling_percent"] == pytest.approx(1 - lost / total_ns,
                                                                                  rel=1e-4)
    reference = reference_json_path()
    report = validate(entry.path, Schema.from_json(reference) if reference is not None else None)
    assert report.conformant, "\n".join(report.lines())


def test_what_if_without_throttling_equals_a_fresh_capture(trn2_mlp: Path, tmp_path: Path) -> None:
    done = _run("analyze", str(trn2_mlp / "device"), "--output-format", "json", "--what-if", "auto")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    (off,) = [w for w in data["what_if"] if w["change"] == "power-throttling=off"]  # auto asked for it
    # and, for the weight queue's finding, the prefetch schedule
    assert "prefetch-weights=on" in {w["change"] for w in data["what_if"]}
    assert off["capture"].endswith("--no-power-throttling -o DIR")
    fresh = _capture_mlp(tmp_path / "off", "trn2.48xlarge", "--no-power-throttling")
    assert _throttle_rows(fresh) == []
    after = _device_time(fresh)
    assert off["device_time_ns"]["after"] == after < off["device_time_ns"]["before"] == _device_time(trn2_mlp)
    (finding,) = [f for f in data["findings"] if f["title"] == "Power throttling"]
    assert finding["gain_ns"] == off["gain_ns"] == off["device_time_ns"]["before"] - after


def test_trn1_captures_have_no_throttling(tmp_path: Path) -> None:
    root = _capture_mlp(tmp_path / "trn1", "trn1.2xlarge")
    assert _throttle_rows(root) == []
    done = _run("analyze", str(root / "device"))
    assert done.returncode == 0 and "Power throttling" not in done.stdout


# -- prefetching weights a layer ahead, bf16 -> fp8 matmuls: compiler options re-simulated --------


def _capture_decode(out: Path, instance: str, *extra: str) -> Path:
    done = _run("capture", "--workload", "llama-decode", "--instance", instance, "--timing-only",
                "--device-only", "--num-exec", "1", "--profile-nth-exec", "1", "-o", str(out), *extra)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def trn2_decode(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _capture_decode(tmp_path_factory.mktemp("decode") / "trn2", "trn2.48xlarge")


def test_prefetch_and_fp8_what_ifs_equal_fresh_captures(trn2_decode: Path, tmp_path: Path) -> None:
    done = _run("analyze", str(trn2_decode / "device"), "--output-format", "json",
                "--what-if", "prefetch-weights=on", "--what-if", "fp8-matmuls=on")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    by_change = {w["change"]: w for w in data["what_if"]}
    before = _device_time(trn2_decode)
    prefetch, fp8 = by_change["prefetch-weights=on"], by_change["fp8-matmuls=on"]
    assert prefetch["capture"].endswith("--prefetch-weights -o DIR")
    assert fp8["capture"].endswith("--fp8-matmuls -o DIR")
    trn2 = "trn2.48xlarge"
    fresh_prefetch = _device_time(_capture_decode(tmp_path / "prefetch", trn2, "--prefetch-weights"))
    fresh_fp8 = _device_time(_capture_decode(tmp_path / "fp8", trn2, "--fp8-matmuls"))
    assert prefetch["device_time_ns"] == {"before": before, "after": fresh_prefetch}
    assert fp8["device_time_ns"] == {"before": before, "after": fresh_fp8}
    # fp8 measurably faster; prefetching no slower (since activation loads left the Sync queue, c751460,
    # the default trn2 decode program already streams its weights ahead: test_prefetch)
    assert fresh_fp8 < 0.97 * before and fresh_prefetch <= before
    assert "double-row" in fp8["note"] and prefetch["note"] is None
    # the finding they address carries the larger measured gain: the weight queue is off this
    # program's critical path, so the Tensor engine's share of it takes fp8's gain
    tensor = [f for f in data["findings"] if "engine Tensor" in f["title"]]
    assert tensor and tensor[0]["gain_ns"] == max(prefetch["gain_ns"], fp8["gain_ns"]) > 0
    facts = json.loads((tmp_path / "fp8" / "rerun.json").read_text())
    assert facts["compiler_options"] == {"auto_cast": None, "auto_cast_type": None, "quantize": None,
                                         "prefetch_weights": False, "fp8_matmuls": True}


def test_fp8_on_trn1_runs_at_the_bf16_rate_and_says_so(tmp_path: Path) -> None:
    root = _capture_decode(tmp_path / "trn1", "trn1.2xlarge")
    done = _run("analyze", str(root / "device"), "--what-if", "fp8-matmuls=on")
    assert done.returncode == 0, done.stderr
    assert "NeuronCore-v2 runs FP8 at the BF16 rate" in done.stdout
    bad = _run("analyze", str(root / "device"), "--what-if", "prefetch-weights=maybe")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "on or off" in bad.stderr
