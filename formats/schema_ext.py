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
    parse_table(
        "TrainingStep", "summary", "device",
        "neuronscope extension: one row per training step (an execution of a step program): its time, "
        "batch, model FLOPs and the time each level of the step kept the core busy. Throughput and "
        "training MFU are formats.figures.training_step_figures of these columns.",
        """
        execution_id           int64    -            Y  the execution that ran the step
        step                   int64    -            Y  1 for the program's first step on this core
        start_ts               int64    nanoseconds  Y  step start (device clock)
        step_time_ns           int64    nanoseconds  Y  the step's device time
        global_batch           int64    -            Y  sequences per step over all ranks
        seq                    int64    -            Y  sequence length (tokens per sequence)
        model_flops            float64  flops        Y  (6 N + 12 L h s) x tokens of the step
        ranks                  int64    -            Y  ranks of the job (tp x pp x dp)
        peak_flops_per_rank    float64  flops        Y  a rank's peak FLOP/s in the step's precision
        forward_ns             int64    nanoseconds  Y  core busy in model/forward
        backward_ns            int64    nanoseconds  Y  core busy in model/backward
        gradient_sync_ns       int64    nanoseconds  Y  core busy in model/gradient_sync (incl. collectives)
        optimizer_ns           int64    nanoseconds  Y  core busy in model/optimizer
        layout                 string   -            Y  model/nodes x instance/tp pp dp/seq/gbs
        """,
        extension=True),
    parse_table(
        "TrainingCollective", "summary", "device",
        "neuronscope extension: the collectives of a training step, each with how much of it ran while "
        "a compute engine was busy (communication/computation overlap).",
        """
        execution_id        int64   -            Y  the step's execution
        name                string  -            Y  HLO name (as CcOp and Instruction show it)
        operation           string  -            Y  AllReduce, ReduceScatter or AllGather
        replica_group_kind  string  -            Y  tp (inside a layer) or dp (gradient synchronisation)
        start_ts            int64   nanoseconds  Y  start (device clock)
        end_ts              int64   nanoseconds  Y  end
        duration_ns         int64   nanoseconds  Y  end_ts - start_ts
        size_bytes          int64   bytes        Y  larger of input and output bytes
        overlap_ns          int64   nanoseconds  Y  time of it during which compute was busy
        """,
        extension=True),
    parse_table(
        "InstructionLod", "summary", "device",
        "neuronscope extension: level of detail for zoomed-out timelines -- per engine and level, the "
        "longest instruction starting in each time bucket (bucket widths grow 4x per level from "
        "span / 2^17), like the real tool's pre-bucketed DmaUsageSummary.",
        """
        engine           string  -            Y  canonical engine name (Tensor, Vector, ...)
        level            int32   -            Y  0 = finest
        bucket_ts        int64   nanoseconds  Y  bucket start
        bucket_width_ns  int64   nanoseconds  Y  bucket width at this level
        start_ts         int64   nanoseconds  Y  start of the longest instruction in the bucket
        end_ts           int64   nanoseconds  Y  its end
        duration_ns      int64   nanoseconds  Y  its duration
        id               int64   -            Y  its Instruction.id
        opcode           string  -            Y  its opcode
        count            int64   -            Y  instructions starting in the bucket
        """,
        extension=True),
)}

# Per-node totals of the Instruction columns of the same name, so an operator table reads time, FLOPs
# and instruction counts per op or layer without scanning Instruction (hierarchy rollups).
_ROLLUP_COLUMNS: tuple[FieldDef, ...] = (
    FieldDef("instruction_count", "int64", None, False,
             "neuronscope extension: instructions of the node"),
    FieldDef("active_time_ns", "int64", "nanoseconds", False,
             "neuronscope extension: total length of time_intervals (union of the node's busy spans)"),
    FieldDef("raw_flops", "int64", "flops", False,
             "neuronscope extension: sum of Instruction.raw_flops over the node"),
    FieldDef("flops_transpose", "int64", "flops", False,
             "neuronscope extension: sum of Instruction.flops_transpose over the node"),
    FieldDef("adjusted_flops", "int64", "flops", False,
             "neuronscope extension: sum of Instruction.adjusted_flops (BF16-equivalent) over the node"),
)

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
        FieldDef("capture_working_dir", "string", None, False,
                 "neuronscope extension: the directory the capture ran in, where the user's source files "
                 "are read from without asking (formats.source_access)"),
        FieldDef("warm_up_execution", "bool", None, False,
                 "neuronscope extension: true when the program ran this model fewer times than the "
                 "capture's profile-nth-exec and the profile holds the last execution before it (a "
                 "warm-up execution, kept so the capture is not empty)"),
        FieldDef("requested_execution", "int64", None, False,
                 "neuronscope extension: the execution number the capture asked for (profile-nth-exec)"),
    ),
    "HloInstruction": _ROLLUP_COLUMNS,
    "FrameworkNode": _ROLLUP_COLUMNS,
    # A profile of a training step: the step's headline figures from its TrainingStep rows
    # (formats.figures.training_step_figures; null when the profile holds no training step)
    "Summary": (
        FieldDef("training_step_time", "float64", "seconds", False,
                 "neuronscope extension: mean TrainingStep.step_time_ns of the profile's steps (s)"),
        FieldDef("training_seq_per_s", "float64", None, False,
                 "neuronscope extension: global batch / step time (sequences or samples per second)"),
        FieldDef("training_tokens_per_s", "float64", None, False,
                 "neuronscope extension: training_seq_per_s x sequence length (0 without sequences)"),
        FieldDef("training_mfu_percent", "float64", "percent", False,
                 "neuronscope extension: model FLOPs of a step / (step time x ranks x peak FLOP/s per "
                 "rank), a fraction 0-1"),
    ),
}
