"""The output formats of ``neuron-profile view --output-format``: one registry, read by the parser
(choices and help), the dispatch (``formats.view_output.render``) and the docs.

A format is a function ``(job: ViewJob) -> None`` registered with its name and help
(``neuronscope.cli_kit.Renderers``, as pyinstrument keeps its renderers); the writers themselves are
in ``formats.view_output`` and load only when a format runs, so building the command line stays
cheap (no DuckDB, no pyarrow).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from neuronscope.cli_kit import Renderers


@dataclass(frozen=True)
class ViewJob:
    """What ``view --output-format`` was asked: the profiles under ``root``, where to write."""

    root: str
    path: str | None  # --output-file; None: stdout (text) or the real tool's file name
    recompute: bool = False
    include_incomplete: bool = False
    all_flows: bool = False


VIEW_FORMATS: Renderers[Callable[[ViewJob], None]] = Renderers("neuron-profile view")


@VIEW_FORMATS.register("summary-text", "a headline and the Summary as text (stdout unless --output-file)")
def summary_text(job: ViewJob) -> None:
    from formats.view_output import write_summary

    write_summary(job, as_json=False)


@VIEW_FORMATS.register("summary-json", "the Summary as JSON (stdout unless --output-file)")
def summary_json(job: ViewJob) -> None:
    from formats.view_output import write_summary

    write_summary(job, as_json=True)


@VIEW_FORMATS.register("json", "legacy device-profile JSON, one profile")
def legacy_json(job: ViewJob) -> None:
    from formats.view_output import write_legacy

    write_legacy(job)


@VIEW_FORMATS.register("perfetto", "a Perfetto trace (.pftrace) of every profile under DIR")
def perfetto(job: ViewJob) -> None:
    from formats.view_output import write_perfetto

    write_perfetto(job)


__all__ = ["VIEW_FORMATS", "ViewJob"]
