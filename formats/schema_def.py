"""Building blocks of the schema definition: a field, a table, and the text form tables are kept in.

Separate from ``formats.schema`` so that the 52-table definition (``schema_tables``) and our own
extension tables (``schema_ext``) can both be written as compact text and parsed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

# Schema type names (profile-schema.md §2.4) -> Arrow types. ``array<Record>`` types of the transient
# HTTP-API tables have no Parquet form and map to None.
ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "array<int64>": pa.list_(pa.int64()),
    "array<string>": pa.list_(pa.string()),
}

# OpenAPI (type, format) as SchemaFields.field_type / field_format describe them.
OPENAPI_TYPES: dict[str, tuple[str, str | None]] = {
    "string": ("string", None),
    "int64": ("integer", "int64"),
    "int32": ("integer", "int32"),
    "float32": ("number", "float"),
    "float64": ("number", "double"),
    "bool": ("boolean", None),
    "array<int64>": ("array", "int64"),
    "array<string>": ("array", "string"),
}


@dataclass(frozen=True)
class FieldDef:
    """One column: schema type name, declared unit (None if none), required = never null."""

    name: str
    type: str
    unit: str | None
    required: bool
    note: str = ""
    enum_name: str | None = None

    @property
    def arrow_type(self) -> pa.DataType | None:
        return ARROW_TYPES.get(self.type)

    @property
    def description(self) -> str:
        """Text for ``SchemaFields.field_description`` (required non-null there)."""
        if self.note:
            return self.note
        unit = f" ({self.unit})" if self.unit else ""
        return f"{self.name.replace('_', ' ')}{unit}"


@dataclass(frozen=True)
class TableDef:
    """One table: its kind (timeline, samples, ...), profile side and fields in schema order."""

    name: str
    kind: str
    profile: str  # "device", "system" or "any"
    row: str  # what one row is
    fields: tuple[FieldDef, ...]
    transient: bool = False  # HTTP-API only, never written to Parquet
    internal: bool = False
    extension: bool = False  # ours, not in the Neuron Explorer schema
    _by_name: dict[str, FieldDef] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({f.name: f for f in self.fields})

    def field(self, name: str) -> FieldDef | None:
        return self._by_name.get(name)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    @property
    def required(self) -> list[str]:
        return [f.name for f in self.fields if f.required]

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema a writer uses; required fields are declared non-nullable."""
        if self.transient:
            raise ValueError(f"{self.name} is a transient HTTP-API type, never stored in Parquet")
        return pa.schema([pa.field(f.name, f.arrow_type, nullable=not f.required) for f in self.fields])


def parse_table(name: str, kind: str, profile: str, row: str, text: str, *, transient: bool = False,
                internal: bool = False, extension: bool = False) -> TableDef:
    """Parse the one-line-per-field text form: ``name type unit Y|N [{Enum}] note...``."""
    fields = []
    for line in text.strip().splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[3] not in ("Y", "N"):
            raise ValueError(f"{name}: bad field line {line.strip()!r}")
        fname, ftype, unit, req, *rest = parts
        enum_name = None
        if rest and rest[0].startswith("{") and rest[0].endswith("}"):
            enum_name = rest.pop(0)[1:-1]
        if ftype not in ARROW_TYPES and not (transient and ftype.startswith("array<")):
            raise ValueError(f"{name}.{fname}: unknown type {ftype!r}")
        fields.append(FieldDef(fname, ftype, None if unit == "-" else unit.replace("~", " "), req == "Y",
                               " ".join(rest), enum_name))
    return TableDef(name, kind, profile, row, tuple(fields), transient, internal, extension)
