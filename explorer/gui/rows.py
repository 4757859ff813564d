"""The timeline's rows: which tracks a session has, in what order, under which group header.

    rows = discover_rows(session)
    [r.label for r in rows]    # ['core 0', 'Tensor', 'TensorMatrix', 'Vector', ..., 'qSyncIO0', ...,
                               #  'CC stream 0', 'HBM throughput', 'NeuronLink ch 64 ...', 'core 1', ...]

One group per (profile, physical core): a header row, then the engines in the real tool's order
(Tensor, TensorMatrix, Vector, Scalar, GpSimd, Sync, then any other track), the DMA queues by name,
the collective streams, and the counters the profile has (HBM, DMA and per-channel NeuronLink
throughput, PSUM/SBUF usage, pending DMAs). A row is a set of raw keys of one table (a real profile
may spell one engine two ways), so it is always drawn from one query per table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from explorer.gui.session import LoadedProfile, Session
from formats.read_api import (
    CC_STREAMS,
    DMA_QUEUES,
    DMA_THROUGHPUT,
    ENGINE_ACTIVE,
    ENGINE_NAMES,
    HBM_THROUGHPUT,
    INSTRUCTION_TRACKS,
    NEURONLINK_THROUGHPUT,
    PENDING_DMA,
    PSUM_USAGE,
    SBUF_USAGE,
    CounterSpec,
    SpanSpec,
    canonical_engine,
)

HEADER, INSTRUCTION, DMA, CC, COUNTER = "header", "instruction", "dma", "cc", "counter"
ACTIVE = "active"  # an engine's busy stretches (ActiveTime): the Tensor engine's union of its two rows
# The Tensor engine's two timeline rows, named by what runs on them (the Summary's "Tensor" is both)
TENSOR_TITLES = {"Tensor": "Tensor · LoadStationary", "TensorMatrix": "TensorMatrix · MATMUL"}
TENSOR_UNION_TITLE = "Tensor engine = both rows"
TRACK_ORDER = ("Tensor", "TensorMatrix", "Vector", "Scalar", "GpSimd", "Sync")
COUNTER_LABELS = {
    HBM_THROUGHPUT: "HBM throughput",
    DMA_THROUGHPUT: "DMA throughput",
    PSUM_USAGE: "PSUM usage",
    SBUF_USAGE: "SBUF usage",
    PENDING_DMA: "Pending DMAs",
}


@dataclass(frozen=True)
class Row:
    """One timeline row. ``keys``: raw key tuples of ``spec`` drawn merged in this row."""

    kind: str
    profile: int  # index into Session.profiles
    group: str
    label: str
    spec: SpanSpec | CounterSpec | None = None
    keys: tuple[tuple[Any, ...], ...] = ()
    engine: str | None = None  # canonical engine of an instruction row, for colour and summaries
    track: str | None = None  # timeline track of an instruction row (TensorMatrix, ...)
    pcore: int | None = None
    scale: tuple[float, float] | None = None  # a counter's (min, max) over the profile
    events: int = 0
    ends_at: int | None = None  # a counter's last meaningful time (relative ns): nothing is drawn after it
    title: str | None = None  # what the row axis shows, when it says more than ``label``

    @property
    def shown(self) -> str:
        return self.title or self.label



def _track_rank(track: str) -> tuple[int, str]:
    return (TRACK_ORDER.index(track), "") if track in TRACK_ORDER else (len(TRACK_ORDER), track)


def _pcore(value: Any) -> int:
    return int(value) if value is not None else 0


def instruction_rows(loaded: LoadedProfile, index: int, group_of: dict[int, str]) -> list[Row]:
    """Rows of the Instruction table: one per (physical core, timeline track); a null track is the
    engine (normalised from any spelling)."""
    assert loaded.tracks is not None
    merged: dict[tuple[int, str], list[Any]] = {}
    for key in loaded.tracks.span_keys(INSTRUCTION_TRACKS):
        pcore, track, engine = key.key
        name = track or canonical_engine(engine) or str(engine)
        entry = merged.setdefault((_pcore(pcore), name), [[], 0, canonical_engine(engine) or str(engine)])
        entry[0].append(key.key)
        entry[1] += key.rows
    rows = []
    for (pcore, name), (keys, events, engine) in sorted(
        merged.items(), key=lambda kv: (kv[0][0], _track_rank(kv[0][1]))
    ):
        rows.append(
            Row(
                INSTRUCTION,
                index,
                group_of.get(pcore, ""),
                name,
                INSTRUCTION_TRACKS,
                tuple(keys),
                engine=engine if engine in ENGINE_NAMES else None,
                track=name,
                pcore=pcore,
                events=events,
            )
        )
    return _name_tensor_rows(loaded, index, rows)


def _name_tensor_rows(loaded: LoadedProfile, index: int, rows: list[Row]) -> list[Row]:
    """Where the Tensor engine has both of its rows on a core, title them by what they run and add
    the engine's union (``ActiveTime``) after them: that is what the Summary's "Tensor" means."""
    from dataclasses import replace

    assert loaded.tracks is not None
    active: dict[int, list[tuple[Any, ...]]] = {}  # physical core -> its Tensor rows' keys
    for key in loaded.tracks.span_keys(ENGINE_ACTIVE):
        pcore, engine = key.key
        if canonical_engine(engine) == "Tensor":
            active.setdefault(_pcore(pcore), []).append(key.key)
    out: list[Row] = []
    for i, row in enumerate(rows):
        pair = {r.track for r in rows if r.pcore == row.pcore and r.engine == "Tensor"}
        split = row.engine == "Tensor" and set(TENSOR_TITLES) <= pair
        out.append(replace(row, title=TENSOR_TITLES.get(row.track or "")) if split else row)
        last_of_pair = split and not any(
            r.pcore == row.pcore and r.engine == "Tensor" for r in rows[i + 1 :]
        )
        if last_of_pair and row.pcore in active:
            out.append(Row(ACTIVE, index, row.group, "Tensor engine", ENGINE_ACTIVE,
                           tuple(active[row.pcore or 0]), engine=None, track="Tensor", pcore=row.pcore,
                           title=TENSOR_UNION_TITLE))
    return out


def dma_rows(loaded: LoadedProfile, index: int, group_of: dict[int, str]) -> list[Row]:
    assert loaded.tracks is not None
    merged: dict[tuple[int, str], list[Any]] = {}
    for key in loaded.tracks.span_keys(DMA_QUEUES):
        pcore, name, idx = key.key
        label = str(name) if name is not None else f"queue {idx}"
        entry = merged.setdefault((_pcore(pcore), label), [[], 0])
        entry[0].append(key.key)
        entry[1] += key.rows
    return [
        Row(DMA, index, group_of.get(pcore, ""), label, DMA_QUEUES, tuple(keys), pcore=pcore, events=n)
        for (pcore, label), (keys, n) in sorted(merged.items())
    ]


def cc_rows(loaded: LoadedProfile, index: int, group: str) -> list[Row]:
    assert loaded.tracks is not None
    return [
        Row(CC, index, group, f"CC stream {key.key[0]}", CC_STREAMS, (key.key,), events=key.rows)
        for key in loaded.tracks.span_keys(CC_STREAMS)
    ]


def _channel_labels(loaded: LoadedProfile) -> dict[int, tuple[str, int]]:
    """NeuronLink channel id -> (label, bytes carried); channels that carried nothing are left out."""
    source_rows = loaded.queries.rows(f"""
        SELECT channel_id, any_value(channel_kind) AS kind, any_value(link_id) AS link,
               any_value(src_device) AS src, any_value(dst_device) AS dst, any_value(direction) AS dir,
               sum(transfer_bytes) AS bytes
        FROM {_relation(loaded, "NeuronLinkUsage")} GROUP BY channel_id ORDER BY channel_id""")
    out = {}
    for r in source_rows:
        if not r["bytes"]:
            continue
        kind = {"neuronlink": "NeuronLink", "efa": "EFA", "on_chip": "on-chip"}.get(
            str(r["kind"]), str(r["kind"])
        )
        link = f" link {r['link']}" if r["link"] is not None else ""
        out[int(r["channel_id"])] = (
            f"{kind}{link} dev {r['src']}→{r['dst']} (ch {r['channel_id']})",
            int(r["bytes"]),
        )
    return out


def _relation(loaded: LoadedProfile, table: str) -> str:
    from formats.read_api import TableSource

    return TableSource(loaded.profile, table).relation()


def profile_end(loaded: LoadedProfile) -> int | None:
    """The profile's last timestamp relative to its origin (None when Metadata does not say)."""
    last = loaded.metadata.get("last_hw_timestamp")
    return None if last is None else int(last) - loaded.origin


def counter_rows(
    loaded: LoadedProfile, index: int, group_of: dict[int, str], pcores: Sequence[int]
) -> list[Row]:
    assert loaded.tracks is not None
    rows: list[Row] = []
    ends_at = profile_end(loaded)
    first_group = group_of.get(min(pcores, default=0), "")
    for spec in (HBM_THROUGHPUT, DMA_THROUGHPUT, PSUM_USAGE, SBUF_USAGE, PENDING_DMA):
        for key, samples in loaded.tracks.counter_keys(spec):
            scale = loaded.tracks.counter_range(spec, [key])
            pcore = _pcore(key[0]) if key else 0
            rows.append(
                Row(
                    COUNTER,
                    index,
                    group_of.get(pcore, first_group),
                    COUNTER_LABELS[spec],
                    spec,
                    (key,),
                    pcore=pcore,
                    scale=scale,
                    events=samples,
                    ends_at=ends_at,
                )
            )
    keys = loaded.tracks.counter_keys(NEURONLINK_THROUGHPUT)
    if keys:
        labels = _channel_labels(loaded)
        for key, samples in keys:
            channel = key[0]
            if channel is None or int(channel) not in labels:
                continue
            scale = loaded.tracks.counter_range(NEURONLINK_THROUGHPUT, [key])
            rows.append(
                Row(
                    COUNTER,
                    index,
                    first_group,
                    labels[int(channel)][0],
                    NEURONLINK_THROUGHPUT,
                    (key,),
                    scale=scale,
                    events=samples,
                    ends_at=ends_at,
                )
            )
    return rows


def discover_rows(session: Session) -> list[Row]:
    """Every row of every profile, grouped per (profile, physical core), each group under a header."""
    rows: list[Row] = []
    for index, loaded in enumerate(session.profiles):
        instr = instruction_rows(loaded, index, {})
        dma = dma_rows(loaded, index, {})
        pcores = sorted({r.pcore for r in instr + dma if r.pcore is not None}) or [0]
        several = len(pcores) > 1
        group_of = {p: f"{loaded.label} · pcore {p}" if several else loaded.label for p in pcores}
        instr = [_regroup(r, group_of) for r in instr]
        dma = [_regroup(r, group_of) for r in dma]
        cc = cc_rows(loaded, index, group_of[pcores[0]])
        counters = counter_rows(loaded, index, group_of, pcores)
        for pcore in pcores:
            group = group_of[pcore]
            mine = [r for r in instr if r.pcore == pcore] + [r for r in dma if r.pcore == pcore]
            if pcore == pcores[0]:
                mine += cc
            mine += [r for r in counters if r.group == group]
            rows.append(Row(HEADER, index, group, group))
            if not mine:
                rows.append(
                    Row(
                        HEADER,
                        index,
                        group,
                        "(nothing to draw: no instructions, DMA, collectives or counters)",
                    )
                )
            rows += mine
    return rows


def _regroup(row: Row, group_of: dict[int, str]) -> Row:
    from dataclasses import replace

    return replace(row, group=group_of.get(row.pcore if row.pcore is not None else 0, row.group))
