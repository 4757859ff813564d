"""``neuron-profile view DIR --output-format ...``: open the profiles and hand them to the right writer.

summary-text (a headline first: ``summary_report``) and summary-json go to stdout (or
``--output-file``); json (legacy device-profile JSON,
one profile at a time, like the real tool's one file per model) and perfetto (every profile under DIR
in one trace, a process each) go to files named as the real tool names them unless told otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from formats import attribution, export, findings, headline, trace_export
from formats.dataset import (
    ProfileEntry,
    capture_state,
    device_entries,
    find_profiles,
    system_note,
    system_only,
)
from formats.query import read_error
from formats.reader import Profile, ProfileError, open_profile
from formats.safe_output import output_file
from formats.view_formats import VIEW_FORMATS, ViewJob


def _programs(root: str, include_incomplete: bool) -> list[tuple[str, Profile]]:
    entries, skipped = find_profiles(root, include_incomplete=include_incomplete)
    for path in skipped:
        print(f"neuron-profile: note: skipped incomplete profile {path}", file=sys.stderr)
    programs = []
    devices, systems = device_entries(entries)
    if not devices:
        raise ProfileError(system_only(root, "neuron-profile view"))
    for entry in systems:  # a capture's system/: host events, no device run
        print(f"neuron-profile: note: {system_note(entry.path)}", file=sys.stderr)
    for entry, profile in open_each(devices):
        name = export.program_name(profile) if entry.name == "." else entry.name
        programs.append((name, profile))
    return programs


def open_each(entries: list[ProfileEntry]) -> list[tuple[ProfileEntry, Profile]]:
    """Open the profiles of a folder, leaving out any that cannot be read with one warning line each
    (neuron-explorer names them in its banner and shows the rest): one damaged execution must not
    hide the others. Raises the first ``ProfileError`` when none opens, or when the folder was
    itself the one profile."""
    opened: list[tuple[ProfileEntry, Profile]] = []
    first_error: ProfileError | None = None
    for entry in entries:
        try:
            opened.append((entry, open_readable(entry.path)))
        except ProfileError as exc:
            first_error = first_error or exc
            if len(entries) > 1:
                print(f"neuron-profile: warning: left out {entry.path}: {exc}", file=sys.stderr)
    if not opened and first_error is not None:
        raise first_error
    return opened


def open_readable(path: Path) -> Profile:
    """``open_profile``, showing what is readable: a table with an unreadable part is left out,
    with one warning line on stderr (as neuron-explorer's banner says it)."""
    left_out: list[str] = []
    profile = open_profile(path, left_out=left_out)
    for note in left_out:
        print(f"neuron-profile: warning: {path}: {note}", file=sys.stderr)
    return profile


def _notes(profile: Profile) -> list[str]:
    """What the headline says before any figure: an incomplete capture, a warm-up execution
    (``formats.dataset.capture_state``, the capture's marks)."""
    state = capture_state(profile.path)
    notes = []
    if state.incomplete or not profile.complete:
        why = f" ({state.reason})" if state.reason else ""
        notes.append(f"incomplete capture{why}: the figures cover what was recorded before it stopped")
    if state.warm_up:
        asked = f" {state.requested_execution}" if state.requested_execution is not None else ""
        notes.append(f"warm-up execution: the program ran the model fewer times than the requested "
                     f"execution{asked}; this is the last one it ran")
    return notes


def _flags(profile: Profile) -> str:
    state = capture_state(profile.path)
    return ", ".join(f for f, on in (("incomplete", state.incomplete or not profile.complete),
                                     ("warm-up", state.warm_up)) if on)


def _problems(profile: Profile, program: headline.Program) -> tuple[findings.Finding, ...]:
    if not profile.has("Instruction"):
        return ()
    return findings.find(profile, program.figures, attribution.attribute(profile))


def summary_report(programs: list[tuple[str, Profile]], values: dict[str, dict[str, Any]]) -> str:
    """summary-text: the headline a person reads first, then the full table.

    One profile: its headline (device time, MFU, busiest engine, DMA/HBM, CC, top problems with the
    op kind they point at) and its full table. A dataset: one row per profile and the aggregate, the
    headline of the profile with the longest device time, and no full tables (summary-json has them,
    or view one profile)."""
    shown = [headline.Program(key, profile, row)
             for (_, profile), (key, row) in zip(programs, values.items())]
    labels = headline.rank_labels(shown)
    for program in shown:
        flags = _flags(program.profile)
        if flags:
            labels[program.name] = ", ".join(x for x in (labels.get(program.name), flags) if x)
    if len(shown) == 1:
        program = shown[0]
        lines = headline.headline_lines(program, labels.get(program.name, ""),
                                        _problems(program.profile, program), _notes(program.profile))
        return "\n".join([*lines, "", "-- full table", export.summary_text(values)])
    lines = headline.dataset_lines(shown, labels)
    longest = headline.longest(shown)
    lines += ["", *headline.headline_lines(longest, labels.get(longest.name, ""),
                                           _problems(longest.profile, longest), _notes(longest.profile))]
    lines += ["", f"(full tables: --output-format summary-json, or view one of the {len(shown)} profiles)"]
    return "\n".join(lines) + "\n"


def _write_text(text: str, path: str | None) -> None:
    if path is None or path == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    with output_file(path, "w") as out:
        out.write(text if text.endswith("\n") else text + "\n")
    print(f"wrote {path}", file=sys.stderr)


def render(root: str, fmt: str, path: str | None, *, recompute: bool = False,
           include_incomplete: bool = False, all_flows: bool = False) -> None:
    """Write ``root``'s profiles in ``fmt`` (summary-text, summary-json, json, perfetto). A file that
    fails while being read (corrupt pages behind a sound footer) is a ``ProfileError`` (one line)."""
    write = VIEW_FORMATS.get(fmt)  # the registry: formats.view_formats
    try:
        write(ViewJob(root, path, recompute=recompute, include_incomplete=include_incomplete,
                      all_flows=all_flows))
    except (duckdb.Error, pa.ArrowException) as exc:
        entries, _ = find_profiles(root, include_incomplete=include_incomplete)
        profiles = [open_profile(e.path) for e in entries]
        raise ProfileError(read_error(profiles, exc, f"{root}: cannot read the profile: ")) from None


def write_summary(job: ViewJob, *, as_json: bool) -> None:
    """summary-text (a headline first) or summary-json, to stdout or ``job.path``."""
    programs = _programs(job.root, job.include_incomplete)
    values = export.collect(programs, recompute=job.recompute)
    _write_text(export.summary_json(values) if as_json else summary_report(programs, values), job.path)


def write_legacy(job: ViewJob) -> None:
    """Legacy device-profile JSON of the one profile under ``job.root``."""
    root, path, recompute = job.root, job.path, job.recompute
    programs = _programs(root, job.include_incomplete)
    if len(programs) != 1:
        raise ProfileError(f"{root}: holds {len(programs)} profiles; legacy JSON is one file per "
                           f"profile, give one profile directory")
    name, profile = programs[0]
    values = export.metrics(profile, recompute=recompute)
    target = path or trace_export.default_path(name).replace(".pftrace", ".json")
    if target == "-":
        export.write_legacy_json(profile, sys.stdout, summary_values=values)
        return
    with output_file(target, "w") as out:
        count = export.write_legacy_json(profile, out, summary_values=values)
    print(f"wrote {count:,} instructions to {target}", file=sys.stderr)


def write_perfetto(job: ViewJob) -> None:
    """Every profile under ``job.root`` in one Perfetto trace (a file: the format is binary)."""
    root, path, all_flows = job.root, job.path, job.all_flows
    programs = _programs(root, job.include_incomplete)
    target = path or trace_export.default_path(programs[0][0] if len(programs) == 1 else Path(root).name)
    if target == "-":
        raise ProfileError("perfetto output is binary: give a file with --output-file")
    with output_file(target, "wb") as out:  # a fresh temporary name, renamed: never through a link
        stats = trace_export.write_trace(programs, out, trace_export.TraceOptions(all_flows=all_flows))
    print(f"wrote {target}: {stats.tracks} tracks, {stats.slices:,} slices, {stats.counters:,} counter "
          f"samples, {stats.flows:,} flows ({stats.bytes / 2**20:.1f} MiB); open it in ui.perfetto.dev",
          file=sys.stderr)
