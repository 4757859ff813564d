"""neuronscope's additions to the profile schema: extra tables and columns, all listed in SchemaFields.

DESIGN.md allows extra tables that never change the meaning of a documented column. Readers built for
the real schema ignore them (§1.2: unknown tables and columns are skipped), so a profile with them stays
a valid 7.x profile.
"""

from __future__ import annotations

from formats.schema_def import FieldDef, TableDef, parse_table

EXTENSION_TABLES: dict[str, TableDef] = {t.name: t for t in (
    parse_table(
        "NeuronLinkUsage", "samples", "device",
        "neuronscope extension: traffic on one inter-chip channel (one direction of a NeuronLink link, an "
        "EFA port or a core's on-chip path) over one sampling window.",
        """
        timestamp           int64    nanoseconds       Y  window start
        duration_ns         int64    nanoseconds       Y  window length
        channel_id          int64    -                 Y  topology channel index
        channel_kind        string   -                 Y  neuronlink, efa or on_chip
        link_id             int64    -                 N  NeuronLink link number; null off NeuronLink
        src_device          int64    -                 Y  sending device (-1: the network, for EFA receive)
        dst_device          int64    -                 Y  receiving device (-1: the network, for EFA transmit)
        direction           int32    -                 Y  0 or 1: which way along the link
        transfer_bytes      int64    bytes             Y  bytes carried in the window
        current_throughput  float32  bytes_per_second  Y  transfer_bytes over the window length
        active_flows        int32    -                 N  most flows sharing the channel at once
        capacity            float32  bytes_per_second  N  the channel's modelled bandwidth
        """,
        extension=True),
)}

# Extra columns on documented tables. Readers of the real schema skip them.
EXTENSION_COLUMNS: dict[str, tuple[FieldDef, ...]] = {
    # What the real tool keeps in DmaPacketAggregated text (source/dest) and debug info, as numbers a
    # summary can add up: which HLO op a packet serves and how many of its bytes touch HBM.
    "DmaPacket": (
        FieldDef("raw_hlo_id", "int64", None, False,
                 "neuronscope extension: HLO op the transfer belongs to (as Instruction.raw_hlo_id)"),
        FieldDef("hbm_read_bytes", "int64", "bytes", False,
                 "neuronscope extension: bytes of this packet read from HBM"),
        FieldDef("hbm_write_bytes", "int64", "bytes", False,
                 "neuronscope extension: bytes of this packet written to HBM"),
    ),
    "Metadata": (
        FieldDef("capture_complete", "bool", None, False,
                 "neuronscope extension: false when the capture was interrupted and the tables hold only "
                 "what was recorded up to then"),
    ),
}
