"""On-disk and wire formats: the Neuron Explorer Parquet profile, neuron-monitor JSON, exports.

Formats never import the explorer. The profile layer (docs/profiles.md):

* ``open_profile(path) -> Profile`` and ``ProfileError`` (reader),
* ``ProfileWriter`` (streaming writer) and ``record_profile`` / ``ProfileRecorder`` (event sink -> writer),
* ``validate(path) -> ValidationReport``,
* ``SCHEMA`` (documented tables + our extensions),
* ``summary_row(profile)``, ``open_query(path)`` -- loaded on first use (they bring DuckDB in;
  recording does not need it until a capture closes). A viewer's read side -- windows, levels of
  detail, figures, source lines -- is ``formats.read_api``.
"""

from formats.reader import Profile, ProfileError, ProfileTable, ProfileWarning, open_profile
from formats.recorder import ProfileRecorder, record_profile
from formats.schema import PROFILE_SCHEMA_VERSION, SCHEMA, Schema
from formats.validate import ValidationReport, validate
from formats.writer import ProfileWriteError, ProfileWriter

_LAZY = {"summary_row": "formats.summary", "opcode_summary": "formats.summary",
         "open_query": "formats.query", "QuerySession": "formats.query", "QueryError": "formats.query"}


def __getattr__(name: str) -> object:
    """The read-side API, imported when first asked for."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'formats' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "PROFILE_SCHEMA_VERSION",
    "SCHEMA",
    "Profile",
    "ProfileError",
    "ProfileRecorder",
    "ProfileTable",
    "ProfileWarning",
    "ProfileWriteError",
    "ProfileWriter",
    "QueryError",
    "QuerySession",
    "Schema",
    "ValidationReport",
    "opcode_summary",
    "open_profile",
    "open_query",
    "record_profile",
    "summary_row",
    "validate",
]
