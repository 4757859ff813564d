"""The bundled sample profiles (made by our own capture) open, validate and summarise."""

from __future__ import annotations

from pathlib import Path

import pytest

from formats import open_profile, validate

SAMPLES = Path(__file__).resolve().parents[2] / "sample_profiles"
PROFILES = sorted(p.parent for p in SAMPLES.rglob("Metadata.parquet"))


def test_samples_exist():
    names = {p.relative_to(SAMPLES).parts[0] for p in PROFILES}
    assert names == {"bert-layer", "llama-decode-tp2", "matmul-trn2"}


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: str(p.relative_to(SAMPLES)))
def test_sample_profile_is_conformant(path):
    report = validate(path)
    assert report.conformant, "\n".join(report.lines())
    profile = open_profile(path)
    assert profile.complete and profile.metadata["is_simulation"]


def test_tensor_parallel_sample_has_collectives_per_rank():
    ranks = sorted((SAMPLES / "llama-decode-tp2/device/model=llama_decode").glob("core=*/execution=2"))
    assert len(ranks) == 2
    for rank in ranks:
        assert open_profile(rank).table("CcOp").num_rows > 0
