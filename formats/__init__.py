"""On-disk and wire formats: the Neuron Explorer Parquet profile, neuron-monitor JSON, exports.

Formats never import the explorer. The profile layer (docs/profiles.md):

* ``open_profile(path) -> Profile`` and ``ProfileError`` (reader),
* ``ProfileWriter`` (streaming writer) and ``record_profile`` / ``ProfileRecorder`` (event sink -> writer),
* ``validate(path) -> ValidationReport``,
* ``SCHEMA`` (documented tables + our extensions).
"""

from formats.reader import Profile, ProfileError, ProfileTable, ProfileWarning, open_profile
from formats.recorder import ProfileRecorder, record_profile, sink_writer
from formats.schema import PROFILE_SCHEMA_VERSION, SCHEMA, Schema
from formats.validate import ValidationReport, validate
from formats.writer import ProfileWriteError, ProfileWriter

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
    "Schema",
    "ValidationReport",
    "open_profile",
    "record_profile",
    "sink_writer",
    "validate",
]
