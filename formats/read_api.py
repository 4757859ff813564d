"""The read side of ``formats``: everything a viewer asks of a profile, in one place.

    from formats.read_api import open_profile, TrackViewport, INSTRUCTION_TRACKS, Window, figures
    profile = open_profile("out/llama/device/.../execution=2")
    tracks = TrackViewport(profile)                       # windows + levels of detail, one per profile
    tracks.span_windows(INSTRUCTION_TRACKS, t0, t1, buckets=2000)   # longest event per pixel bucket
    figures(profile, Window.span(t0, t1)).engines["Tensor"].fraction

Both viewers -- the terminal viewer (``explorer/viewer``) and the GUI (``explorer/gui``) -- and
neuron-top import the profile read side from here and nowhere else in ``formats`` (a test,
``tests/formats/test_read_api.py``, checks it); the modules behind it are implementation. What is
here, by job (each job has exactly one implementation):

* **Opening** a profile or a capture: ``open_profile``, ``open_readable`` (what is readable, a
  damaged optional table left out with one warning), ``Profile``, ``ProfileError``,
  ``find_profiles``, ``capture_state`` ... (``formats.reader``, ``formats.dataset``).
* **Windows, levels of detail and counters** (``formats.tracks`` over ``formats.lod``): a
  ``TrackViewport`` per open profile answers span rows (instruction tracks, DMA queues, collective
  streams) and counter rows reduced to pixel buckets -- Perfetto's rule: per bucket the longest event
  starting in it, **ties to the larger id** (``formats.lod.rank``, the one tie-break everywhere) --
  from the events when zoomed in and from a level of detail (``SpanLod``) when zoomed out. Its thread
  rules are in its docstring: one object shared by a UI thread and a fetch thread.
* **Figures** (``formats.figures``, defined in docs/figures.md): ``Window``, ``figures``, ``whole``,
  ``engine_busy``, ``track_busy``, ``row_busy``, ``busy_buckets`` (busy time per bucket: one
  definition, the exact union), ``from_summary``, ``summary_row``; op/layer/line times
  (``attribute``) and ``find`` (the findings).
* **Analyses** (``formats.analysis``, docs/analyses.md): ``analyze`` -> ``Analysis`` (critical path,
  idle by cause, findings), ``profile_lines`` (its text report), ``critical_path_where`` (the path's
  instructions as an SQL condition over ``Instruction``, for a timeline highlight).
* **Source lines**: ``SourceAccess``, ``read_source``, ``SourceText``, ``SourceStatus`` (a profile's
  recorded paths never escape its working directory).
* **Queries** of a viewer's own: ``TableSource`` (a table's files as a DuckDB relation),
  ``literal``, ``connect``.
* **Hierarchy** (HLO ops, framework layers): ``load_hierarchy`` -> ``FrameworkHierarchy`` (``Layer``,
  ``Op``), the one loader (``formats.hierarchy_read``), and ``parse_ids``, the one parser of the
  tables' id lists (``formats.text_lists``).
* **Formatting** of every figure (``formats.units``): ``fmt_ns``, ``fmt_pct``, ``fmt_bytes`` ...

Names are imported on first use (PEP 562), so ``neuron-top`` asking for a formatter does not load
DuckDB.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from formats.analysis import Analysis, analyze, critical_path_where
    from formats.analyze_command import profile_lines
    from formats.attribution import Attribution, attribute, module_kind
    from formats.dataset import (
        ProfileEntry,
        capture_state,
        device_entries,
        find_profiles,
        in_incomplete_capture,
        system_note,
        system_only,
    )
    from formats.figures import (
        BucketBusy,
        Busy,
        Figures,
        RowSelect,
        Window,
        busiest_opcodes,
        busy_buckets,
        busy_rows,
        engine_busy,
        figures,
        from_summary,
        row_busy,
        track_busy,
        whole,
    )
    from formats.findings import Finding, find
    from formats.hierarchy_read import (
        FrameworkHierarchy,
        Layer,
        Malformed,
        Op,
        OpKey,
        display_name,
        from_instructions,
        load_hierarchy,
    )
    from formats.nullable import add_known, max_known, min_known
    from formats.reader import Profile, ProfileError, ProfileWarning, open_profile, profile_from_files
    from formats.schema import ENGINE_NAMES, canonical_engine, table_of_file
    from formats.source_access import SourceAccess, SourceStatus, SourceText, read_source
    from formats.sqlsource import TableSource, connect, literal
    from formats.summary import summary_row
    from formats.text_lists import IdList, parse_ids
    from formats.tracks import (
        CC_STREAMS,
        COUNTERS,
        DMA_QUEUES,
        DMA_THROUGHPUT,
        ENGINE_ACTIVE,
        HBM_THROUGHPUT,
        INSTRUCTION_TRACKS,
        NEURONLINK_THROUGHPUT,
        PENDING_DMA,
        PSUM_USAGE,
        SBUF_USAGE,
        CounterSpec,
        CounterWindow,
        SpanKey,
        SpanSpec,
        SpanWindow,
        TrackViewport,
        key_condition,
        merge_windows,
    )
    from formats.units import (
        UNKNOWN,
        fmt_bytes,
        fmt_count,
        fmt_flops,
        fmt_gbps,
        fmt_ns,
        fmt_pct,
        fmt_rate,
        percent_cell,
    )
    from formats.view_output import open_readable

_HOME: dict[str, tuple[str, ...]] = {
    "formats.analysis": ("Analysis", "analyze", "critical_path_where"),
    "formats.analyze_command": ("profile_lines",),
    "formats.attribution": ("Attribution", "attribute", "module_kind"),
    "formats.dataset": ("ProfileEntry", "capture_state", "device_entries", "find_profiles",
                        "in_incomplete_capture", "system_note", "system_only"),
    "formats.figures": ("BucketBusy", "Busy", "Figures", "RowSelect", "Window", "busiest_opcodes",
                        "busy_buckets", "busy_rows", "engine_busy", "figures", "from_summary", "row_busy",
                        "track_busy", "whole"),
    "formats.findings": ("Finding", "find"),
    "formats.hierarchy_read": ("FrameworkHierarchy", "Layer", "Malformed", "Op", "OpKey", "display_name",
                               "from_instructions", "load_hierarchy"),
    "formats.nullable": ("add_known", "max_known", "min_known"),
    "formats.reader": ("Profile", "ProfileError", "ProfileWarning", "open_profile", "profile_from_files"),
    "formats.schema": ("ENGINE_NAMES", "canonical_engine", "table_of_file"),
    "formats.source_access": ("SourceAccess", "SourceStatus", "SourceText", "read_source"),
    "formats.sqlsource": ("TableSource", "connect", "literal"),
    "formats.summary": ("summary_row",),
    "formats.text_lists": ("IdList", "parse_ids"),
    "formats.tracks": ("CC_STREAMS", "COUNTERS", "DMA_QUEUES", "DMA_THROUGHPUT", "ENGINE_ACTIVE",
                       "HBM_THROUGHPUT", "INSTRUCTION_TRACKS", "NEURONLINK_THROUGHPUT", "PENDING_DMA",
                       "PSUM_USAGE", "SBUF_USAGE", "CounterSpec", "CounterWindow", "SpanKey", "SpanSpec",
                       "SpanWindow", "TrackViewport", "key_condition", "merge_windows"),
    "formats.units": ("UNKNOWN", "fmt_bytes", "fmt_count", "fmt_flops", "fmt_gbps", "fmt_ns", "fmt_pct",
                      "fmt_rate", "percent_cell"),
    "formats.view_output": ("open_readable",),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}


def __getattr__(name: str) -> object:
    """A name of the read API, imported from its home module when first asked for."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'formats.read_api' has no attribute {name!r}")
    value: object = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


__all__ = [
    "CC_STREAMS",
    "COUNTERS",
    "DMA_QUEUES",
    "DMA_THROUGHPUT",
    "ENGINE_ACTIVE",
    "ENGINE_NAMES",
    "HBM_THROUGHPUT",
    "INSTRUCTION_TRACKS",
    "NEURONLINK_THROUGHPUT",
    "PENDING_DMA",
    "PSUM_USAGE",
    "SBUF_USAGE",
    "UNKNOWN",
    "Analysis",
    "Attribution",
    "BucketBusy",
    "Busy",
    "CounterSpec",
    "CounterWindow",
    "Figures",
    "Finding",
    "FrameworkHierarchy",
    "IdList",
    "Layer",
    "Malformed",
    "Op",
    "OpKey",
    "Profile",
    "ProfileEntry",
    "ProfileError",
    "ProfileWarning",
    "RowSelect",
    "SourceAccess",
    "SourceStatus",
    "SourceText",
    "SpanKey",
    "SpanSpec",
    "SpanWindow",
    "TableSource",
    "TrackViewport",
    "Window",
    "add_known",
    "analyze",
    "attribute",
    "busiest_opcodes",
    "busy_buckets",
    "busy_rows",
    "canonical_engine",
    "capture_state",
    "connect",
    "critical_path_where",
    "device_entries",
    "display_name",
    "engine_busy",
    "figures",
    "find",
    "find_profiles",
    "fmt_bytes",
    "fmt_count",
    "fmt_flops",
    "fmt_gbps",
    "fmt_ns",
    "fmt_pct",
    "fmt_rate",
    "from_instructions",
    "from_summary",
    "in_incomplete_capture",
    "key_condition",
    "literal",
    "load_hierarchy",
    "max_known",
    "merge_windows",
    "min_known",
    "module_kind",
    "open_profile",
    "open_readable",
    "parse_ids",
    "percent_cell",
    "profile_from_files",
    "profile_lines",
    "read_source",
    "row_busy",
    "summary_row",
    "system_note",
    "system_only",
    "table_of_file",
    "track_busy",
    "whole",
]
