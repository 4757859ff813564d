"""The profile schema as the project uses it: documented tables, our extensions, engine names, versions.

``SCHEMA`` is built from the project's own copy (``schema_tables``) plus ``schema_ext`` and needs
nothing outside the package. ``Schema.from_json`` builds the same object from a
``profile-schema.json`` (the reference twin in ``../shared``) so that ``validate`` can check against it
when it is present.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa

from formats.schema_def import ARROW_TYPES, FieldDef, TableDef
from formats.schema_ext import EXTENSION_COLUMNS, EXTENSION_TABLES
from formats.schema_tables import ENUMS, TABLES
from neuroncore.enums import ENGINE_NAMES as CORE_ENGINE_NAMES
from neuroncore.enums import Engine
from neuronscope import settings

PROFILE_SCHEMA_VERSION = "7.4.0"
"""The Neuron Explorer schema version we write and were built for (SDK 2.31/2.32)."""

TABLE_FILE_RE = re.compile(r"^(?P<table>[A-Za-z][A-Za-z0-9]*?)(?:_(?P<part>\d+))?\.parquet$")
"""``<Table>.parquet`` or ``<Table>_N.parquet`` (§1.1); never a prefix glob, which would catch
``DmaPacketAggregated`` when asking for ``DmaPacket``."""

ENGINE_NAMES = CORE_ENGINE_NAMES
"""Canonical engine names (capitalised, as Instruction.engine holds them), in the core's code order;
the one list is ``neuroncore.enums.ENGINE_LABELS``."""

# Canonical engine names by every spelling seen in real profiles (§2.5): each engine's own name in
# lower case, plus the hardware unit names the real tool writes in some tables.
_OTHER_SPELLINGS: dict[Engine, tuple[str, ...]] = {
    Engine.TENSOR: ("pe", "tensormatrix"),
    Engine.VECTOR: ("dve",),
    Engine.SCALAR: ("act", "activation"),
    Engine.GPSIMD: ("pool",),
    Engine.SYNC: ("sp",),
}
ENGINE_ALIASES: dict[str, str] = {
    spelling: engine.label
    for engine in Engine for spelling in (engine.stem, *_OTHER_SPELLINGS[engine])
}

# Columns holding engine names, whose case differs by table in real profiles.
ENGINE_COLUMNS: dict[str, tuple[str, ...]] = {
    "Instruction": ("engine",),
    "ActiveTime": ("engine",),
    "OpcodeSummary": ("engine",),
    "CoreBarriers": ("engine_name",),
    "CcOp": ("trigger_engine",),
    "CcInstruction": ("trigger_engine",),
    "SemaphoreUpdate": ("update_source",),
}


def canonical_engine(name: str | None) -> str | None:
    """``tensor``/``PE``/``Tensor`` -> ``Tensor``; unknown names (``AXI``) come back unchanged."""
    if name is None:
        return None
    return ENGINE_ALIASES.get(name.lower(), name)


def parse_version(text: str) -> tuple[int, int, int]:
    """``MAJOR.MINOR.PATCH`` (missing parts are 0); ValueError on anything else."""
    match = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?\s*", text or "")
    if not match:
        raise ValueError(f"not a schema version: {text!r}")
    major, minor, patch = (int(g or 0) for g in match.groups())
    return major, minor, patch


def table_of_file(filename: str) -> tuple[str, int | None] | None:
    """(table, part number or None) for a profile file name, None if it is not one."""
    match = TABLE_FILE_RE.match(filename)
    if not match:
        return None
    part = match.group("part")
    return match.group("table"), None if part is None else int(part)


@dataclass(frozen=True)
class Schema:
    """A set of table definitions with a version: the documented ones plus our extensions."""

    version: str
    tables: dict[str, TableDef]
    enums: dict[str, tuple[str, ...]]
    source: str  # where the definition came from

    def table(self, name: str) -> TableDef | None:
        return self.tables.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.tables

    def is_system_side(self, table_names: Iterable[str]) -> bool:
        """True for a host-side system profile (a capture's ``system/``): its known tables are the
        schema's system tables (CPU, host memory, system events) and none is a device table
        (``Metadata``, which the schema files under device, is in both). The one rule every view
        uses to tell a capture's system profile from its device profiles."""
        sides = {self.tables[name].profile for name in table_names
                 if name in self.tables and name != "Metadata"}
        return "system" in sides and "device" not in sides

    @property
    def persisted(self) -> list[TableDef]:
        return [t for t in self.tables.values() if not t.transient]

    def arrow_schema(self, name: str) -> pa.Schema:
        table = self.tables.get(name)
        if table is None:
            raise KeyError(f"unknown table {name!r}")
        return table.arrow_schema()

    @classmethod
    def from_json(cls, path: str | os.PathLike[str], *, with_extensions: bool = True) -> Schema:
        """Build from a ``profile-schema.json`` (the reference's machine-readable twin)."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        tables: dict[str, TableDef] = {}
        for name, spec in data["tables"].items():
            fields = tuple(
                FieldDef(f["name"], f["type"], f.get("unit"), bool(f["required"]), f.get("note") or "",
                         f.get("enum_name"))
                for f in spec["fields"])
            for f in fields:
                if f.type not in ARROW_TYPES and not spec.get("transient"):
                    raise ValueError(f"{path}: {name}.{f.name} has unknown type {f.type!r}")
            tables[name] = TableDef(name, spec["kind"], spec["profile"], spec.get("row", ""), fields,
                                    bool(spec.get("transient")), bool(spec.get("internal")))
        schema = cls(str(data["schema_version"]), tables,
                     {k: tuple(v) for k, v in data.get("enums", {}).items()}, str(path))
        return schema.with_extensions() if with_extensions else schema

    def with_extensions(self) -> Schema:
        """This schema plus neuronscope's extension tables and columns."""
        tables = dict(self.tables)
        for name, extra in EXTENSION_COLUMNS.items():
            base = tables[name]
            known = set(base.names)
            tables[name] = replace(base, fields=base.fields + tuple(f for f in extra if f.name not in known))
        for name, table in EXTENSION_TABLES.items():
            tables.setdefault(name, table)
        return replace(self, tables=tables)


DOCUMENTED: Schema = Schema(PROFILE_SCHEMA_VERSION, dict(TABLES), dict(ENUMS), "formats.schema_tables")
"""The documented tables alone, as the real tool defines them."""

SCHEMA: Schema = DOCUMENTED.with_extensions()
"""The project's own definition (documented tables + extensions), independent of ``../shared``."""


def reference_json_path() -> Path | None:
    """The reference ``profile-schema.json`` if it can be found: ``$NEURONSCOPE_PROFILE_SCHEMA``, else
    ``../shared/reference/profile-schema.json`` next to the source checkout."""
    env = settings.PROFILE_SCHEMA.get()
    if env is not None:
        return env if env.is_file() else None
    candidate = Path(__file__).resolve().parents[2] / "shared" / "reference" / "profile-schema.json"
    return candidate if candidate.is_file() else None


def is_extension(table: str, column: str | None = None) -> bool:
    """True for our own tables, and for our extra columns on documented tables."""
    if column is None:
        return table in EXTENSION_TABLES
    if table in EXTENSION_TABLES:
        return True
    return any(f.name == column for f in EXTENSION_COLUMNS.get(table, ()))
