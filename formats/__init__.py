"""On-disk and wire formats: the Neuron Explorer Parquet profile, neuron-monitor JSON, exports.

Formats never import the explorer. The profile layer (docs/profiles.md):

* ``open_profile(path) -> Profile`` and ``ProfileError`` (reader),
* ``ProfileWriter`` (streaming writer) and ``record_profile`` / ``ProfileRecorder`` (event sink -> writer),
* ``validate(path) -> ValidationReport``,
* ``SCHEMA`` (documented tables + our extensions),
* ``summary_row(profile)``, ``open_query(path)`` (they bring DuckDB in).

Every name is loaded on first use, so a small module of the package costs only itself. A viewer's
read side -- windows, levels of detail, figures, source lines -- is ``formats.read_api``.
"""

import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names below, for type checkers; at run time each is imported on first use
    from formats.query import QueryError, QuerySession, open_query
    from formats.reader import Profile, ProfileError, ProfileTable, ProfileWarning, open_profile
    from formats.recorder import ProfileRecorder, record_profile
    from formats.schema import PROFILE_SCHEMA_VERSION, SCHEMA, Schema
    from formats.summary import opcode_summary, summary_row
    from formats.validate import ValidationReport, validate
    from formats.writer import ProfileWriteError, ProfileWriter

# every name is loaded on first use: importing one small module of the package (``formats.units``,
# a command's parser) must not bring PyArrow, DuckDB and the recorder in (``neuron-profile --help``)
_LAZY = {"Profile": "formats.reader", "ProfileError": "formats.reader", "ProfileTable": "formats.reader",
         "ProfileWarning": "formats.reader", "open_profile": "formats.reader",
         "ProfileRecorder": "formats.recorder", "record_profile": "formats.recorder",
         "PROFILE_SCHEMA_VERSION": "formats.schema", "SCHEMA": "formats.schema", "Schema": "formats.schema",
         "ValidationReport": "formats.validate", "validate": "formats.validate",
         "ProfileWriteError": "formats.writer", "ProfileWriter": "formats.writer",
         "summary_row": "formats.summary", "opcode_summary": "formats.summary",
         "open_query": "formats.query", "QuerySession": "formats.query", "QueryError": "formats.query"}


class _Package(types.ModuleType):
    """The package module: ``validate`` stays the function when its submodule ``formats.validate``
    loads (the import system binds a loaded submodule on its package under the same name; when this
    package imported every name eagerly, its own binding came last and won)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "validate" and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> object:
    """Each public name, imported when first asked for."""
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
