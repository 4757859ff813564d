"""The project's own schema definition against the reference JSON, and the schema helpers."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from formats.schema import (
    DOCUMENTED,
    ENGINE_NAMES,
    SCHEMA,
    Schema,
    canonical_engine,
    is_extension,
    parse_version,
    reference_json_path,
    table_of_file,
)
from formats.schema_def import ARROW_TYPES, parse_table

REFERENCE = reference_json_path()
needs_reference = pytest.mark.skipif(REFERENCE is None,
                                     reason="../shared/reference/profile-schema.json absent")


@needs_reference
def test_builtin_definition_matches_reference_json() -> None:
    data = json.loads(REFERENCE.read_text(encoding="utf-8"))  # type: ignore[union-attr]
    assert DOCUMENTED.version == data["schema_version"]
    assert list(DOCUMENTED.tables) == list(data["tables"])
    for name, spec in data["tables"].items():
        ours = DOCUMENTED.tables[name]
        assert (ours.kind, ours.profile, ours.transient, ours.internal) == (
            spec["kind"], spec["profile"], bool(spec.get("transient")), bool(spec.get("internal"))), name
        theirs = [(f["name"], f["type"], f["unit"], f["required"], f.get("enum_name"))
                  for f in spec["fields"]]
        mine = [(f.name, f.type, f.unit, f.required, f.enum_name) for f in ours.fields]
        assert mine == theirs, name
    assert {k: list(v) for k, v in DOCUMENTED.enums.items()} == data["enums"]
    assert sum(len(t.fields) for t in DOCUMENTED.tables.values()) == data["counts"]["fields"]


@needs_reference
def test_from_json_gives_the_same_schema_plus_extensions() -> None:
    loaded = Schema.from_json(REFERENCE)  # type: ignore[arg-type]
    assert set(loaded.tables) == set(SCHEMA.tables)
    for name, table in SCHEMA.tables.items():
        assert loaded.tables[name].names == table.names, name


def test_extensions_are_marked_and_typed() -> None:
    link = SCHEMA.tables["NeuronLinkUsage"]
    assert link.extension and "NeuronLinkUsage" not in DOCUMENTED.tables
    assert link.field("timestamp").arrow_type == pa.int64()
    assert link.field("timestamp").unit == "nanoseconds"
    assert is_extension("NeuronLinkUsage") and is_extension("Metadata", "capture_complete")
    assert not is_extension("Metadata", "is_simulation")
    assert SCHEMA.tables["Metadata"].field("capture_complete") is not None


def test_every_persisted_table_has_an_arrow_schema() -> None:
    for table in SCHEMA.persisted:
        schema = table.arrow_schema()
        assert schema.names == table.names
        for f in table.fields:
            assert schema.field(f.name).nullable == (not f.required)
    with pytest.raises(ValueError, match="transient"):
        SCHEMA.tables["MemoryBandwidthPoint"].arrow_schema()


def test_documented_conventions_hold_in_our_copy() -> None:
    # §2.1 every *_ts / duration_ns / timestamp column is int64 nanoseconds
    for table in DOCUMENTED.persisted:
        for f in table.fields:
            if f.name in ("start_ts", "end_ts", "timestamp", "duration_ns"):
                assert f.type == "int64" and f.unit == "nanoseconds", (table.name, f.name)
    instr = DOCUMENTED.tables["Instruction"]
    assert len(instr.fields) == 55 and len(instr.required) == 9
    assert DOCUMENTED.tables["SemaphoreUpdate"].field("id").type == "string"
    assert set(ARROW_TYPES) >= {f.type for t in DOCUMENTED.persisted for f in t.fields}


def test_parse_table_rejects_bad_lines() -> None:
    with pytest.raises(ValueError, match="bad field line"):
        parse_table("T", "timeline", "device", "row", "start_ts int64 nanoseconds maybe")
    with pytest.raises(ValueError, match="unknown type"):
        parse_table("T", "timeline", "device", "row", "start_ts int128 - Y")


@pytest.mark.parametrize(("name", "expected"), [
    ("Instruction.parquet", ("Instruction", None)),
    ("Instruction_12.parquet", ("Instruction", 12)),
    ("DmaPacketAggregated.parquet", ("DmaPacketAggregated", None)),
    ("StackFrameFileName_0.parquet", ("StackFrameFileName", 0)),
    ("Instruction.csv", None),
    ("Instruction_x.parquet", None),
])
def test_table_file_names(name: str, expected: tuple[str, int | None] | None) -> None:
    assert table_of_file(name) == expected


def test_engine_names_and_versions() -> None:
    for spelled, canonical in [("tensor", "Tensor"), ("PE", "Tensor"), ("Pool", "GpSimd"), ("DVE", "Vector"),
                               ("ACT", "Scalar"), ("Activation", "Scalar"), ("sp", "Sync"), ("AXI", "AXI")]:
        assert canonical_engine(spelled) == canonical
    assert all(canonical_engine(e) == e for e in ENGINE_NAMES)
    assert canonical_engine(None) is None
    assert parse_version("7.4.0") == (7, 4, 0) and parse_version("12") == (12, 0, 0)
    with pytest.raises(ValueError):
        parse_version("seven")
