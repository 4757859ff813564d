"""``neuron-profile analyze DIR``: the analyses of ``formats.analysis`` from the command line.

    neuron-profile analyze out/bert/device/model=bert_layer/core=0/execution=2
    neuron-profile analyze out/llama/device --output-format json      # a folder: every profile + ranks

DIR is one profile or a folder of them (a capture's ``device/``: the ranks of a parallel group);
a folder adds the across-ranks analysis (``formats.ranks``). Text is for people (ranked findings with
their evidence first); JSON for scripts (docs/analyses.md lists its keys). Errors are one line and
exit 2 (``neuronscope.cli_kit``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from formats.analysis import Analysis, analyze
from formats.breakdown import OpKind
from formats.profile_commands import ANALYZE_HELP
from formats.units import fmt_bytes, fmt_flops, fmt_gbps, fmt_ns, fmt_pct
from neuronscope.cli_kit import EXIT_OK, CliError, Renderers

__all__ = ["ANALYZE_FORMATS", "AnalyzeCommand", "analyze_dir", "text_lines"]

ANALYZE_FORMATS: Renderers[Any] = Renderers("neuron-profile analyze")


def analyze_dir(root: str, *, include_incomplete: bool = False) -> dict[str, Any]:
    """Analyse every profile under ``root``: ``{"profiles": {relpath: Analysis}, "ranks": RankReport
    or None}``. A folder holding no profile is a one-line ``CliError``."""
    from formats.dataset import find_profiles, system_only
    from formats.ranks import rank_report
    from formats.view_output import open_each

    entries, _ = find_profiles(root, include_incomplete=include_incomplete)
    if not entries:
        raise CliError(f"{root}: no profile found (a profile is a directory of <Table>.parquet files)")
    readable = open_each(entries)
    entries = [entry for entry, _ in readable]
    names = {entry.name: (str(root) if entry.name == "." else entry.name) for entry in entries}
    opened = {names[entry.name]: profile for entry, profile in readable}
    # A capture directory holds device/ (one profile per execution and core: the ranks) and system/
    # (the host side). The system profile has no instructions: it is neither analysed nor a rank.
    system = sorted(name for name, p in opened.items() if p.is_system)
    profiles = {name: p for name, p in opened.items() if name not in system}
    if not profiles:
        raise CliError(system_only(root, "analyze"))
    analyses = {name: analyze(p) for name, p in profiles.items()}
    # Ranks are the cores that ran one program together: the same model= and execution= partitions
    # on different core= (a tensor-parallel group). A generation's context-encoding and
    # token-generation programs on one core are two programs, not two ranks.
    groups: dict[str, list[str]] = {}
    for entry in entries:
        name = names[entry.name]
        if name in profiles:
            key = ", ".join(f"{k}={entry.partitions[k]}" for k in ("model", "execution")
                            if k in entry.partitions)
            groups.setdefault(key, []).append(name)
    reports = {key: rank_report({n: profiles[n] for n in members}, {n: analyses[n] for n in members})
               for key, members in groups.items() if len(members) > 1}
    ranks = next(iter(reports.values())) if len(reports) == 1 else None
    return {"profiles": analyses, "ranks": ranks, "system": system,
            "rank_groups": reports if len(reports) > 1 else {}}


def _share_line(label: str, table: dict[str, int], total: int, n: int = 6) -> str | None:
    if not table:
        return None
    items = list(table.items())[:n]
    return f"  {label:<12}" + "  ".join(f"{k} {fmt_pct(v / total)}" for k, v in items)


def profile_lines(name: str, a: Analysis) -> Iterator[str]:
    """One profile's text report: headline, ranked findings, path shares, idle by cause."""
    yield f"{name}: device time {fmt_ns(a.device_time_ns)}"
    path = a.critical_path
    if path is not None:
        same = "= device time" if path.length_ns == a.device_time_ns else \
            f"(device time {fmt_ns(a.device_time_ns)})"
        yield (f"critical path {fmt_ns(path.length_ns)} {same}: {path.events:,} events, "
               f"{path.implicit_events:,} linked by timing alone")
    if a.findings:
        yield "findings (ranked by the time they account for):"
        for i, f in enumerate(a.findings, 1):
            gain = f"; measured gain {fmt_ns(f.gain_ns)}" if f.gain_ns is not None else ""
            yield f"  {i}. {f.title}"
            yield f"     evidence: {f.evidence}{gain}"
            if f.where:
                yield f"     where: {f.where}"
    if path is not None and path.length_ns:
        yield "critical path by:"
        for label, table in (("engine", path.by_engine), ("DMA queue", path.by_queue),
                             ("collective", path.by_collective), ("op kind", path.by_op_kind),
                             ("layer kind", path.by_layer_kind)):
            line = _share_line(label, table, path.length_ns)
            if line:
                yield line
        ops = [c for c in path.top if c.source][:5]
        if ops:
            yield "top ops on the path:"
            for c in ops:
                yield f"  {c.name:<16}{fmt_ns(c.time_ns):>10}  {c.layer or '-'}  {c.source}"
    t = a.temporal
    if t is not None and t.device_time_ns:
        T = t.device_time_ns
        overlap = ", ".join(f"{label} {fmt_pct(v)} overlapped with compute"
                            for label, v in (("DMA", t.dma_overlap), ("collectives", t.collective_overlap))
                            if v is not None)
        yield (f"time: compute {fmt_pct(t.compute_ns / T)}, DMA only {fmt_pct(t.dma_only_ns / T)}, "
               f"collective only {fmt_pct(t.collective_only_ns / T)}, idle {fmt_pct(t.idle_ns / T)}"
               + (f"; {overlap}" if overlap else ""))
    if a.dma_queues:
        yield "DMA queues (bytes per transfer, small transfers, achieved rate):"
        for q in a.dma_queues[:6]:
            rate = q.achieved_bytes_per_s
            of = (f" = {fmt_pct(rate / a.dma_ceiling_bytes_per_s)} of the DMA ceiling"
                  if rate and a.dma_ceiling_bytes_per_s else "")
            per = fmt_bytes(q.bytes_per_transfer)
            noun = "transfer " if q.transfers == 1 else "transfers"
            yield (f"  {q.queue:<20} {q.transfers:>6} {noun}  {per:>10}/transfer  "
                   f"{q.small_transfers} under 32 KiB  {fmt_gbps(rate) if rate else '-'}{of}")
    roof = [o for o in a.bottom_up if o.flops]
    if roof:
        yield "op kinds on the Tensor roofline (FLOP per HBM byte, achieved vs bound):"
        for o in roof[:5]:
            yield roofline_line(o)
    if a.idle:
        yield "idle by cause:"
        for engine, r in a.idle.items():
            frac = fmt_pct(r.total_ns / a.device_time_ns) if a.device_time_ns else "-"
            causes = ", ".join(f"{c} {fmt_ns(v)}" for c, v in list(r.by_cause.items())[:4])
            yield f"  {engine:<7} {fmt_ns(r.total_ns):>9} ({frac}): {causes}"
    for analysis, reason in a.skipped:
        yield f"not run: {analysis}: {reason}"
    for note in a.notes:
        yield f"note: {note}"


def roofline_line(o: OpKind) -> str:
    """One op kind against its roofline; an op kind without a bound says why (not "-/s, --bound")."""
    got, bound = o.achieved_flops_per_s, o.roofline_flops_per_s
    share = f" ({fmt_pct(got / bound)})" if got and bound else ""
    intensity = f"{o.intensity:.1f}" if o.intensity is not None else "-"
    achieved = f"{fmt_flops(got)}/s" if got else "-"
    if bound:
        against = f" of {fmt_flops(bound)}/s{share}, {o.bound}-bound"
    elif not o.hbm_bytes:  # its operands never left the chip: no memory side to bound it
        against = ", no HBM bytes (operands on chip): no roofline bound"
    else:
        against = ", no roofline bound (the profile's Metadata has no peak FLOPs or HBM bandwidth)"
    return f"  {o.kind:<16} intensity {intensity:>8}  {achieved}{against}"


def text_lines(result: dict[str, Any]) -> Iterator[str]:
    """The text report of ``analyze_dir``'s result."""
    system = result.get("system") or []
    if system:
        device = [name for name in result["profiles"] if name != "."]
        yield f"device profiles (analysed): {', '.join(device)}"
        yield f"system profile (host side: not a rank, not analysed): {', '.join(system)}"
        yield ""
    ranks = result.get("ranks")
    if ranks is not None:
        yield from ranks.text_lines()
        yield ""
    for key, report in (result.get("rank_groups") or {}).items():
        yield f"ranks of {key}:"
        yield from report.text_lines()
        yield ""
    for name, a in result["profiles"].items():
        yield from profile_lines(name, a)
        yield ""


def to_json(result: dict[str, Any]) -> dict[str, Any]:
    """The JSON report: one profile -> its analysis object; a folder -> profiles + ranks."""
    profiles = result["profiles"]
    if len(profiles) == 1 and result.get("ranks") is None:
        return next(iter(profiles.values())).to_json()
    out: dict[str, Any] = {"profiles": {name: a.to_json() for name, a in profiles.items()},
                           "system_profiles": list(result.get("system") or [])}
    ranks = result.get("ranks")
    if ranks is not None:
        out.update(ranks.to_json())
    if result.get("rank_groups"):
        out["rank_groups"] = {key: r.to_json() for key, r in result["rank_groups"].items()}
    return out


@ANALYZE_FORMATS.register("text", "ranked findings with evidence, then the path and idle tables")
def _render_text(result: dict[str, Any], out: Any) -> None:
    for line in text_lines(result):
        print(line, file=out)


@ANALYZE_FORMATS.register("json", "one JSON object (docs/analyses.md lists the keys)")
def _render_json(result: dict[str, Any], out: Any) -> None:
    json.dump(to_json(result), out, indent=1, allow_nan=False)
    print(file=out)


class AnalyzeCommand:
    """Why is this slow: critical path, idle attribution, across ranks."""

    name = "analyze"
    help = ANALYZE_HELP

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("profile", metavar="DIR", help="profile directory, or a folder of them (ranks)")
        ANALYZE_FORMATS.add_option(parser, default="text")
        parser.add_argument("--include-incomplete", action="store_true",
                            help="also read interrupted captures (<dir>.incomplete)")

    def run(self, args: argparse.Namespace) -> int:
        result = analyze_dir(args.profile, include_incomplete=args.include_incomplete)
        ANALYZE_FORMATS.get(args.output_format)(result, sys.stdout)
        return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - the installed CLI is neuron-profile
    from formats.profile_commands import run_cli

    return run_cli(argv, [AnalyzeCommand()])
