"""The Neuron Explorer profile schema 7.4.0, table by table: the project's own copy.

Kept as data so that ``formats`` works without ``../shared``; ``tests/formats/test_schema.py`` checks it
against ``profile-schema.json`` whenever that file is present. Each table is one ``parse_table(...)`` call:
kind, profile side, what a row is, then one line per field in the schema's order::

    name  type  unit  required(Y/N)  [{EnumName}]  note...

``-`` means no unit declared; ``~`` stands for a space inside a unit (``bytes~per~second``).
Notes are our own short glosses and become ``SchemaFields.field_description``.
"""

# One field per line reads better than wrapped notes:
# ruff: noqa: E501

from __future__ import annotations

from formats.schema_def import TableDef, parse_table

ENUMS: dict[str, tuple[str, ...]] = {
    'DmaQueueType': ('instruction', 'input', 'output', 'data', 'software_dynamic', 'hardware_dynamic', 'unknown'),
    'ErrorType': ('Custom Notification', 'Errors', 'Warnings'),
    'MemoryBandwidthDirection': ('host_to_device', 'device_to_host', 'bidirectional'),
    'PerformanceMode': ('2x', '4x'),
}

TABLES: dict[str, TableDef] = {t.name: t for t in (
    parse_table(
        'ActiveTime', 'timeline', 'device',
        'One stretch of time in which a single engine of one physical core was busy.',
        """
        start_ts     int64   nanoseconds  Y
        end_ts       int64   nanoseconds  Y
        engine       string  -            Y  lowercase in practice, tensor (§2.5)
        pcore_idx    int64   -            Y  physical core within the LNC (0/1 on LNC2)
        duration_ns  int64   nanoseconds  Y
        """),
    parse_table(
        'AssemblyInstruction', 'lookup', 'device',
        'The compile-time form (opcode, operands, pc) of one executed instruction.',
        """
        instruction_id     int64   -  Y  → Instruction.id
        compiler_opcode    string  -  Y  e.g. PSEUDO_DMA_TRIGGER
        compiler_operands  string  -  Y  compile-time operand text
        compiler_pc        int64   -  Y  instr index on its engine at compile time
        """),
    parse_table(
        'BirInstruction', 'hierarchy', 'device',
        'One BIR-level hierarchy node: the instructions lowered from one BIR instruction, with merged busy spans and traffic totals.',
        """
        id                                    int64         -            Y  assembly-level instruction id
        raw_bir_id                            int64         -            Y  packed BIR id (§2.7)
        raw_penguin_id                        int64         -            Y  packed Penguin id
        raw_hlo_id                            int64         -            Y  packed HLO id
        raw_framework_id                      int64         -            Y  packed framework-op id
        bir_name                              string        -            Y  e.g. I-1347-2_sg0000
        modular_flow_invocation_idx           int64         -            Y  which call of the function
        pcore_idx                             int64         -            N  physical core within the LNC (0/1 on LNC2)
        start_ts                              int64         nanoseconds  Y  earliest start of grouped instrs
        end_ts                                int64         nanoseconds  Y  latest end of grouped instrs
        time_intervals                        string        -            Y  merged busy spans as text, [[1, 10], [20, 50]]
        element_count_per_interval            array<int64>  -            Y  elements processed, one per span
        transpose_element_count_per_interval  array<int64>  -            Y  transpose elements, one per span
        hbm_transfer_size_per_interval        array<int64>  bytes        Y  HBM bytes, one per span
        hbm_read_bytes                        int64         bytes        Y
        hbm_write_bytes                       int64         bytes        Y
        sbuf_read_bytes                       int64         bytes        N
        sbuf_write_bytes                      int64         bytes        N
        load_weight_bytes                     int64         bytes        N  bytes moved by LDWEIGHTS
        """),
    parse_table(
        'CcInstruction', 'timeline', 'device',
        'One instruction run by a collective-communication (CC) core.',
        """
        start_ts          int64   nanoseconds  Y
        end_ts            int64   nanoseconds  Y
        duration_ns       int64   nanoseconds  Y
        core_idx          int64   -            Y  CC-core that ran it
        description       string  -            Y  firmware instr name, e.g. DMA_ADVANCE
        trigger_engine    string  -            N  engine that kicked it off, e.g. Pool
        trigger_start_ts  int64   nanoseconds  N  start of the triggering PSEUDO_TRIGGER_COLLECTIVE
        """),
    parse_table(
        'CcOp', 'timeline', 'device',
        'One collective operation (AllGather, …) run by the collective engines, with its size and bandwidth.',
        """
        start_ts                int64    nanoseconds       Y
        end_ts                  int64    nanoseconds       Y
        duration_ns             int64    nanoseconds       Y
        operation               string   -                 Y  e.g. AllGather
        algorithm               string   -                 Y  e.g. Ring
        num_elements            int64    -                 Y
        dtype                   string   -                 Y  e.g. fp16
        op_id                   int64    -                 Y
        stream_id               int64    -                 Y  unique within the profile; → CcStream
        stream_index            int64    -                 Y  stream number within the execution
        trigger_engine          string   -                 Y  e.g. Pool
        input_size              int64    bytes             N
        output_size             int64    bytes             N
        algorithm_bandwidth     float32  bytes_per_second  N  algbw
        bus_bandwidth           float32  bytes_per_second  N  busbw
        trigger_start_ts        int64    nanoseconds       N  start of the triggering PSEUDO_TRIGGER_COLLECTIVE
        cc_trigger_start_delay  int64    nanoseconds       N  trigger → execution start
        replica_group_id        int64    -                 N  id of the rank group
        replica_group           string   -                 N  ranks as text, [[0, 1, 2, 3]]
        """),
    parse_table(
        'CcStream', 'lookup', 'device',
        'One collective stream and the CC-cores it is mapped to.',
        """
        stream_id     int64   -  Y  ← CcOp.stream_id
        stream_index  int64   -  Y  stream number within the execution
        cc_core_ids   string  -  Y  text list, [8,9,10,11]
        """),
    parse_table(
        'CoreBarriers', 'timeline', 'device',
        'One barrier that lines up the same engine across the physical cores of a logical core (LNC).',
        """
        start_ts           int64   nanoseconds  Y
        end_ts             int64   nanoseconds  Y
        duration_ns        int64   nanoseconds  Y
        engine_name        string  -            Y  e.g. GpSimd
        id                 int64   -            Y  barrier op id
        semaphore          int64   -            Y  semaphore number it uses
        compiler_pc        int64   -            Y  instr index at compile time
        compiler_opcode    string  -            Y  e.g. PSEUDO_CORE_BARRIER
        compiler_operands  string  -            Y  wait / increment conditions (§2.8)
        pcore_idx          int64   -            N  physical core within the LNC (0/1 on LNC2)
        """),
    parse_table(
        'CpuUsage', 'samples', 'system',
        'One host CPU-utilisation sample for one CPU (or the all-CPU average) on one instance.',
        """
        timestamp                   int64    nanoseconds  Y
        util_percent                float32  percent      Y  0–1 vs 0–100 scale unverified
        cpu_id                      string   -            Y  CPU number or average
        instance_id                 string   -            Y  EC2 instance id
        ultraserver_id              int64    -            N  UltraServer only
        ultraserver_instance_index  int64    -            N  instance position in the UltraServer
        """),
    parse_table(
        'DeviceProfileList', 'lookup', 'system',
        'One device profile (NTFF) that belongs to this system profile.',
        """
        device_profile_name  string  -  Y
        instance_id          string  -  Y
        process_id           int64   -  Y
        nc_id                int64   -  Y  NeuronCore
        session_id           int64   -  N
        model_id             int64   -  N
        """),
    parse_table(
        'DmaPacket', 'timeline', 'device',
        'One hardware DMA packet moved by one DMA engine.',
        """
        start_ts               int64    nanoseconds       Y
        end_ts                 int64    nanoseconds       Y
        duration_ns            int64    nanoseconds       Y
        pcore_idx              int64    -                 N  physical core within the LNC (0/1 on LNC2)
        id                     int64    -                 Y  packet id
        packet_idx             int32    -                 Y  position within its transfer
        packet_aggregation_id  int64    -                 Y  → DmaPacketAggregated.id
        engine_idx             int64    -                 N  DMA engine
        read_bytes             int64    bytes             Y
        write_bytes            int64    bytes             Y
        transfer_bytes         int64    bytes             Y
        throughput             float32  bytes_per_second  Y
        queue_type             string   -                 Y  {DmaQueueType}  enum DmaQueueType (§2.9)
        variable               string   -                 N  tensor name
        queue_name             string   -                 N  e.g. qSyncIO0 (§2.9)
        queue_idx              int64    -                 N  queue number
        crc                    int64    -                 Y  payload checksum
        """),
    parse_table(
        'DmaPacketAggregated', 'timeline', 'device',
        'One logical DMA transfer on one queue (a compiler block): the packets that together move one or more tensors.',
        """
        start_ts                   int64    nanoseconds       Y
        end_ts                     int64    nanoseconds       Y
        duration_ns                int64    nanoseconds       Y
        id                         int64    -                 Y  ← DmaPacket.packet_aggregation_id
        pcore_idx                  int64    -                 N  physical core within the LNC (0/1 on LNC2)
        block_id                   int32    -                 Y  compiler's transfer id
        queue_idx                  int64    -                 Y
        queue_name                 string   -                 Y  e.g. qScalarSpillReload0-Q1-E64
        queue_type                 string   -                 N  {DmaQueueType}  enum DmaQueueType
        op                         string   -                 Y  e.g. read
        variable                   string   -                 Y  tensor name
        read_bytes                 int64    bytes             Y
        write_bytes                int64    bytes             Y
        transfer_bytes             int64    bytes             Y
        throughput                 float32  bytes_per_second  Y
        source                     string   -                 Y  e.g. [SB]
        dest                       string   -                 Y  e.g. [OUTPUT]
        semaphore_id               string   -                 Y  e.g. S[10] (qGpSimdPIO0)
        modular_flow_function      string   -                 N  e.g. sg0000:0
        read_sbuf_partitions       string   -                 Y  text, e.g. 0,1
        read_num_sbuf_partitions   int32    -                 Y
        read_shape                 string   -                 Y  text, [1024, 512]
        read_offset                string   -                 Y  text, hex, [0x2000]
        read_steps                 string   -                 Y  source strides, text
        write_sbuf_partitions      string   -                 Y  text, e.g. 0-15
        write_num_sbuf_partitions  int32    -                 Y
        write_shape                string   -                 Y  text
        write_offset               string   -                 Y  text, hex
        write_steps                string   -                 Y  destination strides, text
        is_transpose_mode          bool     -                 N
        transpose_element_size     string   -                 N  text, [2]
        transpose_shape            string   -                 N  text
        transpose_from_shape       string   -                 N  text
        transpose_to_shape         string   -                 N  text
        transpose_unroll_factor    string   -                 N  text, [128, 32, 1, 2]
        trigger                    int64    -                 N  ns ts: triggering instr start (no unit declared)
        completion                 int64    -                 N  ns ts: triggering instr end (no unit declared)
        """),
    parse_table(
        'DmaQueuesInfo', 'lookup', 'device',
        'One DMA queue declared in the NEFF and how it is wired (DMA engine, AXI port, DRAM channel).',
        """
        name          string  -  Y  e.g. qSyncDynamicHW
        type          string  -  Y  free text, e.g. weights (not the enum)
        pcore_idx     int64   -  Y  physical core within the LNC (0/1 on LNC2)
        idx           int64   -  Y  queue number inside its DMA engine
        engine_idx    int64   -  Y  DMA engine
        axi_port      int64   -  Y  bus port
        dram_channel  int64   -  Y  memory channel
        """),
    parse_table(
        'DmaUsage', 'samples', 'device',
        'One sample of DMA throughput.',
        """
        timestamp             int64    nanoseconds       Y
        current_throughput    float32  bytes_per_second  Y  rate at this instant
        total_transfer_bytes  int64    bytes             Y  DMA bytes (HBM and SBUF)
        pcore_idx             int64    -                 N  physical core within the LNC (0/1 on LNC2)
        """),
    parse_table(
        'DmaUsageSummary', 'summary', 'device',
        'One fixed-width time bucket of DmaUsage samples, pre-aggregated so zoomed-out queries stay fast (internal).',
        """
        timestamp                 int64    nanoseconds  Y  bucket start
        pcore_idx                 int64    -            Y  physical core within the LNC (0/1 on LNC2)
        sum_current_throughput    float64  -            Y  Σ over bucket (no unit declared)
        sum_total_transfer_bytes  int64    -            Y  Σ over bucket (no unit declared)
        max_total_transfer_bytes  int64    -            Y  max in bucket (no unit declared)
        count                     int64    -            Y  raw samples in bucket
        bucket_resolution_ns      int64    nanoseconds  Y  bucket width
        """, internal=True),
    parse_table(
        'Error', 'timeline', 'device',
        'One hardware error or notification event (out-of-bounds access, NaN, custom notification).',
        """
        description    string  -            Y  short text
        error_type_id  int32   -            Y  numeric code
        metadata       string  -            N  decoded detail, e.g. sem 5 overflow
        metadata_hex   string  -            N  raw detail, hex
        pcore_idx      int64   -            N  physical core within the LNC (0/1 on LNC2)
        timestamp      int64   nanoseconds  Y
        type           string  -            Y  {ErrorType}  enum ErrorType
        """),
    parse_table(
        'ExecutionInfo', 'metadata', 'device',
        'One execution (one run of a NEFF) captured in the profile.',
        """
        execution_index     int32   -            Y  0-based
        neff_name           string  -            N  e.g. model.neff
        execution_start_ts  int64   nanoseconds  N  relative to profile start
        execution_end_ts    int64   nanoseconds  N  relative to profile start
        num_subgraphs       int32   -            N
        row_count           int64   -            N  rows written for this execution
        """),
    parse_table(
        'Flow', 'edges', 'device',
        'One directed dependency edge from a row of one table to a row of the same or another table.',
        """
        in_id            int64   -            Y  source row id
        out_id           int64   -            Y  target row id
        in_table         string  -            Y  source table, e.g. instruction
        out_table        string  -            Y  target table, e.g. dma_block
        dependency_type  string  -            N  e.g. FLOW_DEPENDENCE
        gap_time         int64   nanoseconds  N  source end → target start
        """),
    parse_table(
        'FrameworkInstruction', 'hierarchy', 'device',
        'One framework-level op node (an aten op inside a layer, say) with rolled-up time, traffic and per-engine instruction counts.',
        """
        id                                    int64         -            Y  assembly-level instruction id
        raw_bir_id                            int64         -            Y  packed BIR id (§2.7)
        raw_penguin_id                        int64         -            Y  packed Penguin id
        raw_hlo_id                            int64         -            Y  packed HLO id
        raw_framework_id                      int64         -            Y  packed framework-op id
        modular_flow_invocation_idx           int64         -            N  which call of the function
        framework_name                        string        -            N  e.g. NeuronLlamaDecoderLayer[1]/function[2]/aten.add
        start_ts                              int64         nanoseconds  Y  earliest start of grouped instrs
        end_ts                                int64         nanoseconds  Y  latest end of grouped instrs
        time_intervals                        string        -            Y  merged busy spans as text, [[1, 10], [20, 50]]
        element_count_per_interval            array<int64>  -            Y  elements processed, one per span
        transpose_element_count_per_interval  array<int64>  -            Y  transpose elements, one per span
        hbm_transfer_size_per_interval        array<int64>  bytes        Y  HBM bytes, one per span
        hbm_read_bytes                        int64         bytes        Y
        hbm_write_bytes                       int64         bytes        Y
        sbuf_read_bytes                       int64         bytes        N
        sbuf_write_bytes                      int64         bytes        N
        load_weight_bytes                     int64         bytes        N  bytes moved by LDWEIGHTS
        tensor_engine_instruction_count       int64         -            N  PE instrs
        scalar_engine_instruction_count       int64         -            N  ACT instrs
        sync_engine_instruction_count         int64         -            N  SP instrs
        gpsimd_engine_instruction_count       int64         -            N  POOL instrs
        vector_engine_instruction_count       int64         -            N  DVE instrs
        """),
    parse_table(
        'FrameworkNode', 'hierarchy', 'device',
        'One node of the framework module tree (layer/module) with its children, time span, traffic and utilisation.',
        """
        node_name                             string   -            Y  e.g. NeuronLlamaDecoderLayer
        children_names                        string   -            Y  text list
        parent_name                           string   -            Y  parent node
        children_ids                          string   -            Y  framework-op ids, text list
        start_ts                              int64    nanoseconds  Y  earliest start in node
        end_ts                                int64    nanoseconds  Y  latest end in node
        time_intervals                        string   -            Y  merged busy spans as text
        element_count_per_interval            string   -            N  text list here (array in other hierarchy tables)
        transpose_element_count_per_interval  string   -            N  text list
        hbm_transfer_size_per_interval        string   bytes        N  text list
        hfu                                   float32  percent      N  whole-node HFU
        mfu                                   float32  percent      N  whole-node MFU
        hfu_per_interval                      string   -            N  text list, one per span
        mfu_per_interval                      string   -            N  text list, one per span
        mbu_per_interval                      string   -            N  text list, one per span
        hbm_read_bytes                        int64    bytes        N
        hbm_write_bytes                       int64    bytes        N
        sbuf_read_bytes                       int64    bytes        N
        sbuf_write_bytes                      int64    bytes        N
        tensor_engine_instruction_count       int64    -            N
        scalar_engine_instruction_count       int64    -            N
        sync_engine_instruction_count         int64    -            N
        gpsimd_engine_instruction_count       int64    -            N
        vector_engine_instruction_count       int64    -            N
        total_time_tensor                     string   nanoseconds  N  text [min_ts, max_ts] of Tensor instrs
        total_time_scalar                     string   nanoseconds  N  text [min_ts, max_ts] of Scalar instrs
        total_time_sync                       string   nanoseconds  N  text [min_ts, max_ts] of Sync instrs
        total_time_gpsimd                     string   nanoseconds  N  text [min_ts, max_ts] of GpSimd instrs
        total_time_vector                     string   nanoseconds  N  text [min_ts, max_ts] of Vector instrs
        load_weight_bytes                     int64    bytes        N  bytes moved by LDWEIGHTS
        total_channels_scalar                 int64    -            N  channels processed by ACT
        total_channels_vector                 int64    -            N  channels processed by DVE
        """),
    parse_table(
        'HbmUsage', 'samples', 'device',
        'One sample of HBM throughput.',
        """
        timestamp             int64    nanoseconds       Y
        current_throughput    float32  bytes_per_second  Y  rate at this instant
        total_transfer_bytes  int64    bytes             Y  HBM bytes moved
        pcore_idx             int64    -                 N  physical core within the LNC (0/1 on LNC2)
        """),
    parse_table(
        'HbmUsageSummaryByType', 'summary', 'device',
        'HBM bytes held by one usage category on one NeuronCore.',
        """
        neuron_device_idx  int64   -      Y
        neuroncore_idx     int64   -      Y
        usage_type         string  -      Y  e.g. Weights
        usage_bytes        int64   bytes  Y
        """),
    parse_table(
        'HloInstruction', 'hierarchy', 'device',
        'One HLO-level hierarchy node (e.g. dot.1) with merged busy spans and traffic totals.',
        """
        id                                    int64         -            Y  assembly-level instruction id
        raw_bir_id                            int64         -            Y  packed BIR id (§2.7)
        raw_penguin_id                        int64         -            Y  packed Penguin id
        raw_hlo_id                            int64         -            Y  packed HLO id
        raw_framework_id                      int64         -            Y  packed framework-op id
        hlo_name                              string        -            Y  e.g. dot.1
        modular_flow_invocation_idx           int64         -            N  which call of the function
        start_ts                              int64         nanoseconds  Y  earliest start of grouped instrs
        end_ts                                int64         nanoseconds  Y  latest end of grouped instrs
        time_intervals                        string        -            Y  merged busy spans as text, [[1, 10], [20, 50]]
        element_count_per_interval            array<int64>  -            Y  elements processed, one per span
        transpose_element_count_per_interval  array<int64>  -            Y  transpose elements, one per span
        hbm_transfer_size_per_interval        array<int64>  bytes        Y  HBM bytes, one per span
        hbm_read_bytes                        int64         bytes        Y
        hbm_write_bytes                       int64         bytes        Y
        sbuf_read_bytes                       int64         bytes        N
        sbuf_write_bytes                      int64         bytes        N
        load_weight_bytes                     int64         bytes        N  bytes moved by LDWEIGHTS
        """),
    parse_table(
        'HostMemUsage', 'samples', 'system',
        'One host-memory sample for one instance.',
        """
        timestamp                   int64    nanoseconds  Y
        used_bytes                  int64    bytes        Y
        used_percent                float32  percent      Y  scale unverified
        instance_id                 string   -            Y  EC2 instance id
        ultraserver_id              int64    -            N  UltraServer only
        ultraserver_instance_index  int64    -            N  instance position in the UltraServer
        """),
    parse_table(
        'Instruction', 'timeline', 'device',
        'One instruction executed on a compute engine, with its identity, source attribution, memory traffic and FLOPs.',
        """
        start_ts                        int64   nanoseconds  Y
        end_ts                          int64   nanoseconds  Y
        duration_ns                     int64   nanoseconds  Y
        engine                          string  -            Y  capitalised in practice, Tensor (§2.5)
        timeline_track                  string  -            N  UI row, e.g. TensorMatrix
        pcore_idx                       int64   -            N  physical core within the LNC (0/1 on LNC2)
        opcode                          string  -            Y  runtime opcode, e.g. MATMUL
        operands                        string  -            Y  runtime operand text (§2.8)
        compiler_opcode                 string  -            N  compile-time opcode
        compiler_operands               string  -            N  compile-time operand text
        id                              int64   -            Y  unique per executed instruction
        pc                              int64   -            Y  runtime instr index on its engine
        compiler_pc                     int64   -            N  compile-time instr index
        penguin_id                      string  -            N  e.g. sg0000:83
        raw_penguin_id                  int64   -            N  packed Penguin id
        bir_id                          string  -            Y  e.g. sg0000:218805
        raw_bir_id                      int64   -            N  packed subgraph/function/instr (§2.7)
        bir_instruction_name            string  -            N  e.g. I-83-1_sg0001
        kernel_instruction_name         string  -            N  <name>:<tensorizer parent id>, e.g. inst.42:67
        crc_in                          int64   -            N  input checksum
        crc_out                         int64   -            N  output checksum
        evt_wait_time_ns                int64   nanoseconds  N  time blocked on events/semaphores
        hlo_attrs                       string  -            N  HLO debug attributes
        hlo_name                        string  -            N  e.g. dot.1
        raw_hlo_id                      int64   -            N  → hierarchy tables
        raw_framework_id                int64   -            N  → hierarchy tables
        layer                           string  -            N  framework debug-info name
        stack_frame_ids                 string  -            N  text list → StackFrame.id
        nki_source_location             string  -            N  file.py:line from NKI
        bir_debug_info_source_location  string  -            N  file.py:line from BIR debug info
        dma_trigger_start_ts            int64   -            N  start of the DMA it triggered (ns, no unit declared)
        dma_trigger_end_ts              int64   -            N  end of the DMA it triggered (ns, no unit declared)
        dma_wait_time_ns                int64   nanoseconds  N  delay after the triggering instr ends
        instruction_chain               string  -            N  chained instructions
        hbm_read_bytes                  int64   -            N  bytes (no unit declared)
        hbm_write_bytes                 int64   -            N  bytes (no unit declared)
        sbuf_read_bytes                 int64   -            N  bytes (no unit declared)
        sbuf_write_bytes                int64   -            N  bytes (no unit declared)
        spill_save_bytes                int64   -            N  SBUF→HBM spill bytes
        spill_reload_bytes              int64   -            N  HBM→SBUF reload bytes
        psum_read_bytes                 int64   -            N  bytes (no unit declared)
        psum_write_bytes                int64   -            N  bytes written (doc text says 'read')
        psum_read_sbuf_write_bytes      int64   -            N  PSUM→SBUF bytes
        input_queue_bytes               int64   -            N  via input DMA queues
        output_queue_bytes              int64   -            N  via output DMA queues
        weight_queue_bytes              int64   -            N  via data/weight DMA queues
        performance_mode                string  -            N  {PerformanceMode}  enum PerformanceMode; null = base rate
        tensor_instruction_type         string  -            N  e.g. REGULAR, TRANSPOSE
        tensor_elements                 int64   -            N  slated for deprecation; avoid
        raw_flops                       int64   -            N  FLOPs as executed
        adjusted_flops                  int64   -            N  BF16-equivalent (§2.10)
        tensor_elements_transpose       int64   -            N  TRANSPOSE type only
        flops_transpose                 int64   -            N  TRANSPOSE type only
        adjusted_flops_transpose        int64   -            N  BF16-equivalent, TRANSPOSE only
        scalar_activation_fn            string  -            N  ACT function, e.g. COPY
        """),
    parse_table(
        'KernelInstructions', 'lookup', 'device',
        'One NKI kernel instruction with pointers to its innermost call frame and innermost loop variable.',
        """
        kernel_instruction_name   string  -  Y  ← Instruction.kernel_instruction_name, e.g. inst.72:0
        stack_frame_id            int64   -  N  innermost frame → KernelStackFrames
        stack_frame_depth         int64   -  N  frames in the stack
        iteration_variables_id    int64   -  N  innermost loop var → KernelIterationVariables
        iteration_variable_depth  int64   -  N  loop nesting depth
        pcore_idx                 int64   -  N  physical core within the LNC (0/1 on LNC2)
        file_path                 string  -  N  source file
        line_number               int64   -  N  source line
        """),
    parse_table(
        'KernelIterationVariables', 'lookup', 'device',
        'One loop-variable value in an NKI loop nest, linked to the enclosing loop.',
        """
        iteration_variable_id         int64   -  Y
        variable_name                 string  -  N  e.g. k
        variable_value                int64   -  N  value in this iteration
        parent_iteration_variable_id  int64   -  N  enclosing loop's entry
        pcore_idx                     int64   -  N  physical core within the LNC (0/1 on LNC2)
        file_path                     string  -  N  where defined
        line_number                   int64   -  N  where defined
        """),
    parse_table(
        'KernelStackFrames', 'lookup', 'device',
        'One call-stack frame of NKI kernel code, linked to its caller.',
        """
        stack_frame_id                 int64   -  Y
        fully_qualified_function_name  string  -  N
        parent_stack_frame_id          int64   -  N  caller frame
        pcore_idx                      int64   -  N  physical core within the LNC (0/1 on LNC2)
        file_path                      string  -  N  where the function is defined
        line_number                    int64   -  N  where the function is defined
        """),
    parse_table(
        'MemoryBandwidthPoint', 'samples', 'system',
        'Transient (HTTP API only): one host↔device bandwidth sample.',
        """
        timestamp                int64    nanoseconds       Y
        bandwidth_bytes_per_sec  float64  bytes~per~second  Y  sum over tensor I/O events; unit spelt with spaces
        """, transient=True),
    parse_table(
        'MemoryBandwidthResponse', 'samples', 'system',
        'Transient (HTTP API only): the reply body, a list of bandwidth series.',
        """
        series  array<MemoryBandwidthSeries>  -  Y
        """, transient=True),
    parse_table(
        'MemoryBandwidthSeries', 'samples', 'system',
        'Transient (HTTP API only): the samples for one (instance, worker, core, direction) group.',
        """
        instance_id  string                       -  Y
        worker_gid   int64                        -  N  global worker id
        nc_idx       int64                        -  N  logical core
        direction    string                       -  Y  {MemoryBandwidthDirection}  enum MemoryBandwidthDirection
        points       array<MemoryBandwidthPoint>  -  Y  time-ordered
        """, transient=True),
    parse_table(
        'Metadata', 'metadata', 'device',
        'The single profile-level record: schema version, capture environment and the hardware constants the metrics use.',
        """
        profile_schema_version          string   -                 Y  semver, e.g. 7.4.0 (§1.4)
        ntff_version                    int32    -                 Y  trace-file format version
        num_physical_cores              int32    -                 Y  pcores per LNC
        vnc_enabled                     bool     -                 Y  true when LNC > 1
        first_hw_timestamp              int64    nanoseconds       Y  trace start
        last_hw_timestamp               int64    nanoseconds       Y  trace end
        first_ts                        string   -                 Y  text, 1970-01-01 00:00:00+00:00
        last_ts                         string   -                 Y  text form
        dma_ddr_bandwidth               float32  bytes_per_second  Y  peak DMA DDR rate per pcore
        num_dma_engines_per_neuroncore  int32    -                 Y
        hbm_ddr_bandwidth               float32  bytes_per_second  Y  peak HBM rate
        tensor_engine_num_rows          int64    -                 Y  PE array rows
        tensor_engine_num_cols          int64    -                 Y  PE array columns
        tensor_engine_clock_freq        float32  gigahertz         Y
        vector_engine_clock_freq        float32  gigahertz         Y
        vector_engine_num_channels      int64    -                 Y
        scalar_engine_clock_freq        float32  gigahertz         Y
        scalar_engine_num_channels      int64    -                 Y
        gpsimd_engine_clock_freq        float32  gigahertz         Y
        gpsimd_engine_num_channels      int64    -                 Y
        neuroncore_clock_freq           float32  gigahertz         Y
        ticks_per_nanosec               int64    -                 Y  raw tick → ns factor
        instance_type                   string   -                 N  e.g. trn1.2xlarge
        runtime_version                 string   -                 N
        collectives_version             string   -                 N
        driver_version                  string   -                 N
        explorer_version                string   -                 N  tool that post-processed
        compiler_version                string   -                 N  compiler that built the NEFF
        neuroncore_idx                  int64    -                 N
        neuron_device_idx               int64    -                 N
        ultraserver_id                  int64    -                 N
        ultraserver_type                string   -                 N  e.g. UltraCluster
        ultraserver_size                int32    -                 N  instances in the UltraServer
        ultraserver_instance_index      int32    -                 N
        s3_bucket_path                  string   -                 N  where raw files were uploaded
        profile_name                    string   -                 N  user-chosen
        explorer_build_time             string   -                 N
        is_simulation                   bool     -                 N  compiler simulation, not hardware (our core: true)
        """),
    parse_table(
        'NeffHeader', 'metadata', 'device',
        'The header of the executed NEFF.',
        """
        network_name              string  -      N  NEFF name
        uuid                      string  -      N
        hash                      string  -      N
        enabled_features          string  -      N  comma-separated
        header_size               int64   bytes  N
        data_size                 int64   bytes  N
        major_version             int64   -      N
        minor_version             int64   -      N
        package_version           string  -      N
        build_version             string  -      N
        cc_participant_count      int64   -      N  collective participants
        neuroncore_count          int64   -      N
        logical_neuroncore_count  int64   -      N
        pcore_count_per_lnc       int64   -      N
        """),
    parse_table(
        'OpcodeSummary', 'summary', 'device',
        'Totals for one (engine, opcode) pair.',
        """
        engine               string   -            Y  e.g. tensor (case: §2.5)
        opcode               string   -            Y  e.g. MATMUL
        instruction_count    int64    -            Y
        instruction_time_ns  int64    nanoseconds  Y  Σ durations
        active_time_ns       int64    nanoseconds  Y  union of busy spans
        active_time_percent  float32  -            Y  no unit declared; scale unverified
        """),
    parse_table(
        'PendingDma', 'samples', 'device',
        'One sample of how many DMAs are queued but not yet finished.',
        """
        timestamp  int64  nanoseconds  Y
        value      int32  -            Y  outstanding DMA count
        pcore_idx  int64  -            N  physical core within the LNC (0/1 on LNC2)
        """),
    parse_table(
        'PenguinInstruction', 'hierarchy', 'device',
        'One Penguin-level hierarchy node with merged busy spans and traffic totals.',
        """
        id                                    int64         -            Y  assembly-level instruction id
        raw_bir_id                            int64         -            Y  packed BIR id (§2.7)
        raw_penguin_id                        int64         -            Y  packed Penguin id
        raw_hlo_id                            int64         -            Y  packed HLO id
        raw_framework_id                      int64         -            Y  packed framework-op id
        penguin_name                          string        -            Y  Penguin op name
        modular_flow_invocation_idx           int64         -            N  which call of the function
        start_ts                              int64         nanoseconds  Y  earliest start of grouped instrs
        end_ts                                int64         nanoseconds  Y  latest end of grouped instrs
        time_intervals                        string        -            Y  merged busy spans as text, [[1, 10], [20, 50]]
        element_count_per_interval            array<int64>  -            Y  elements processed, one per span
        transpose_element_count_per_interval  array<int64>  -            Y  transpose elements, one per span
        hbm_transfer_size_per_interval        array<int64>  bytes        Y  HBM bytes, one per span
        hbm_read_bytes                        int64         bytes        Y
        hbm_write_bytes                       int64         bytes        Y
        sbuf_read_bytes                       int64         bytes        N
        sbuf_write_bytes                      int64         bytes        N
        load_weight_bytes                     int64         bytes        N  bytes moved by LDWEIGHTS
        """),
    parse_table(
        'PsumUsage', 'samples', 'device',
        'One PSUM occupancy sample: the mean and each of the 8 banks.',
        """
        timestamp            int64    nanoseconds  Y
        avg_util_percent     float32  percent      N  mean over banks
        bank_0_util_percent  float32  percent      N
        bank_1_util_percent  float32  percent      N
        bank_2_util_percent  float32  percent      N
        bank_3_util_percent  float32  percent      N
        bank_4_util_percent  float32  percent      N
        bank_5_util_percent  float32  percent      N
        bank_6_util_percent  float32  percent      N
        bank_7_util_percent  float32  percent      N
        pcore_idx            int64    -            N  physical core within the LNC (0/1 on LNC2)
        """),
    parse_table(
        'SbufAllocation', 'timeline', 'device',
        'One period during which an SBUF address range of one partition is occupied, and by what.',
        """
        start_ts        int64   nanoseconds  Y  allocated
        end_ts          int64   nanoseconds  Y  freed
        start_address   int64   bytes        Y  first byte, inclusive
        end_address     int64   bytes        Y  last byte, inclusive
        partition       int64   -            Y  0, 32, 64 or 96
        op_source_type  string  -            N  e.g. instruction or DMA
        opcode          string  -            N  instruction sources only
        operands        string  -            N  instruction sources only
        queue_name      string  -            N  DMA sources only
        block_id        int64   -            N  DMA sources only
        tensor_name     string  -            N  if known
        hlo_name        string  -            N  if known
        pcore_idx       int64   -            N  physical core within the LNC (0/1 on LNC2)
        """),
    parse_table(
        'SbufUsage', 'samples', 'device',
        'One SBUF occupancy sample: the mean and partition groups 0/32/64/96.',
        """
        timestamp                  int64    nanoseconds  Y
        avg_util_percent           float32  percent      N  mean over partitions
        partition_0_util_percent   float32  percent      N
        partition_32_util_percent  float32  percent      N
        partition_64_util_percent  float32  percent      N
        partition_96_util_percent  float32  percent      N
        pcore_idx                  int64    -            N  physical core within the LNC (0/1 on LNC2)
        """),
    parse_table(
        'SchemaFields', 'metadata', 'any',
        "One field of one table, described (the profile's self-description).",
        """
        table_name         string   -  Y
        table_description  string   -  Y
        field_name         string   -  Y
        field_description  string   -  Y
        field_example      string   -  N
        field_type         string   -  Y  OpenAPI type, e.g. string
        field_required     bool     -  Y
        field_format       string   -  N  e.g. int64
        field_unit         string   -  N
        field_minimum      float32  -  N
        field_maximum      float32  -  N
        field_enum_values  string   -  N  comma-separated
        """),
    parse_table(
        'SemaphoreUpdate', 'timeline', 'device',
        "One change of a semaphore's value: new value, who changed it, how and when.",
        """
        timestamp              int64   nanoseconds  Y
        id                     string  -            Y  semaphore id (string)
        value                  int32   -            Y  value after the update
        update_source          string  -            N  Tensor/Scalar/Vector/Sync/GpSimd/AXI
        double_set_or_clear    bool    -            N  double set/clear flag
        update_mode            int32   -            N  raw ISA mode number
        update_operation_type  string  -            N  sem_inc, sem_dec, evt_set, … (§2.8)
        update_trigger_timing  string  -            N  read or complete
        pcore_idx              int64   -            N  physical core within the LNC (0/1 on LNC2)
        """),
    parse_table(
        'StackFrame', 'lookup', 'device',
        'One frame of the interned framework call-stack tree.',
        """
        id                string  -  Y  1-based, stored as string
        file_location_id  int32   -  Y  → StackFrameFileLocation.id
        parent_frame_id   string  -  Y  0 = root
        """),
    parse_table(
        'StackFrameFileLocation', 'lookup', 'device',
        'One interned (file, function, line) triple.',
        """
        id                string  -  Y  1-based, stored as string
        file_name_id      int32   -  Y  → StackFrameFileName.id
        function_name_id  int32   -  Y  → StackFrameFunctionName.id
        line_number       int32   -  Y
        """),
    parse_table(
        'StackFrameFileName', 'lookup', 'device',
        'One interned source file name.',
        """
        id    string  -  Y  1-based, stored as string
        name  string  -  Y  e.g. model.py
        """),
    parse_table(
        'StackFrameFunctionName', 'lookup', 'device',
        'One interned function name.',
        """
        id    string  -  Y  1-based, stored as string
        name  string  -  Y
        """),
    parse_table(
        'Summary', 'summary', 'device',
        'Whole-profile metrics (normally one row); definitions in §4.',
        """
        total_time                                 float32  seconds  N  device wall time (§4.1)
        neuroncore_cycle_count                     int64    cycles   N  time × base clock
        model_flops                                int64    flops    N  HLO matmul FLOPs
        hardware_flops                             int64    flops    N  all PE matmul FLOPs
        transpose_flops                            int64    flops    N  PE transposes, ⊂ hardware
        adjusted_hardware_flops                    int64    flops    N  BF16-equivalent
        adjusted_transpose_flops                   int64    flops    N  BF16-equivalent
        mm_arithmetic_intensity                    float32  -        N  FLOP per HBM byte
        peak_flops_bandwidth_ratio                 float32  -        N  roofline ridge point
        trace_count                                int64    -        N  all NTFF trace events
        event_count                                int64    -        N  event notifications only
        total_row_count                            int64    -        N  rows written
        dma_active_cycles                          int64    cycles   N  × NeuronCore clock
        dma_active_time                            float32  seconds  N  union of DMA busy spans
        dma_active_time_percent                    float32  percent  N  fraction 0–1
        static_dma_active_time                     float32  seconds  N  compiler-generated DMAs
        dynamic_dma_active_time_percent            float32  percent  N  fraction 0–1
        static_dma_active_time_percent             float32  percent  N  fraction 0–1
        dma_transfer_average_bytes                 float32  bytes    N  bytes / transfers
        dma_packet_time                            float32  seconds  N  Σ packet durations
        dma_transfer_time                          float32  seconds  N  Σ transfer durations
        dma_transfer_count                         int64    -        N
        dma_transfer_total_bytes                   int64    bytes    N
        dma_queue_count                            int64    -        N  queues in the NEFF
        inputs_and_weights_size_bytes              int64    bytes    N
        inputs_outputs_weights_size_bytes          int64    bytes    N
        weight_size_bytes                          int64    bytes    N  from the NEFF
        static_dma_packet_count                    int64    -        N
        static_dma_size                            int64    bytes    N  bytes
        dynamic_dma_packet_percent                 float32  percent  N  fraction 0–1
        static_dma_packet_percent                  float32  percent  N  fraction 0–1
        dynamic_dma_size_percent                   float32  percent  N  fraction 0–1
        static_dma_size_percent                    float32  percent  N  fraction 0–1
        mbu_estimated_percent                      float32  percent  N  fraction 0–1
        mbu_min_read_util_percent                  float32  percent  N  fraction 0–1
        hbm_write_bytes                            int64    bytes    N
        hbm_read_bytes                             int64    bytes    N
        sbuf_write_bytes                           int64    bytes    N
        sbuf_read_bytes                            int64    bytes    N
        spill_save_bytes                           int64    bytes    N
        spill_reload_bytes                         int64    bytes    N
        psum_write_bytes                           int64    bytes    N
        psum_read_bytes                            int64    bytes    N
        psum_read_sbuf_write_count                 int64    -        N  instructions
        psum_read_sbuf_write_bytes                 int64    bytes    N
        input_queue_bytes                          int64    bytes    N
        output_queue_bytes                         int64    bytes    N
        weight_queue_bytes                         int64    bytes    N  via data queues
        software_dynamic_dma_active_time           float32  seconds  N
        software_dynamic_dma_active_time_percent   float32  percent  N  fraction 0–1
        software_dynamic_dma_packet_count          int64    -        N
        software_dynamic_dma_size                  int64    bytes    N  bytes
        software_dynamic_dma_packet_percent        float32  percent  N  fraction 0–1
        software_dynamic_dma_size_percent          float32  percent  N  fraction 0–1
        hardware_dynamic_dma_active_time           float32  seconds  N
        hardware_dynamic_dma_active_time_percent   float32  percent  N  fraction 0–1
        hardware_dynamic_dma_packet_count          int64    -        N
        hardware_dynamic_dma_size                  int64    bytes    N  bytes
        hardware_dynamic_dma_packet_percent        float32  percent  N  fraction 0–1
        hardware_dynamic_dma_size_percent          float32  percent  N  fraction 0–1
        tensor_engine_instruction_time             float32  seconds  N  Σ durations
        tensor_engine_active_time                  float32  seconds  N  union, no semaphore waits
        tensor_engine_active_time_percent          float32  percent  N  fraction 0–1
        tensor_engine_instruction_count            int64    -        N
        matmul_instruction_count                   int64    -        N
        mfu_estimated_percent                      float32  percent  N  fraction 0–1
        mfu_max_achievable_estimated_percent       float32  percent  N  fraction 0–1
        mfu_hlo_estimated_percent                  float32  percent  N  fraction 0–1
        mfu_hlo_max_achievable_estimated_percent   float32  percent  N  fraction 0–1
        mfu_inst_estimated_percent                 float32  percent  N  fraction 0–1
        mfu_inst_max_achievable_estimated_percent  float32  percent  N  fraction 0–1
        hfu_estimated_percent                      float32  percent  N  fraction 0–1
        vector_engine_instruction_time             float32  seconds  N  Σ durations
        vector_engine_active_time                  float32  seconds  N  union, no semaphore waits
        vector_engine_active_time_percent          float32  percent  N  fraction 0–1
        vector_engine_instruction_count            int64    -        N
        scalar_engine_instruction_time             float32  seconds  N  Σ durations
        scalar_engine_active_time                  float32  seconds  N  union, no semaphore waits
        scalar_engine_active_time_percent          float32  percent  N  fraction 0–1
        scalar_engine_instruction_count            int64    -        N
        activate_instruction_time                  float32  seconds  N  ACTIVATE + ACTIVATE_QUANTIZE
        activate_instruction_count                 int64    -        N  ACTIVATE + ACTIVATE_QUANTIZE
        sync_engine_instruction_time               float32  seconds  N  Σ durations
        sync_engine_active_time                    float32  seconds  N  union, no semaphore waits
        sync_engine_active_time_percent            float32  percent  N  fraction 0–1
        sync_engine_instruction_count              int64    -        N
        gpsimd_engine_instruction_time             float32  seconds  N  Σ durations
        gpsimd_engine_active_time                  float32  seconds  N  union, no semaphore waits
        gpsimd_engine_active_time_percent          float32  percent  N  fraction 0–1
        gpsimd_engine_instruction_count            int64    -        N
        cc_op_time                                 float32  seconds  N  Σ CcOp durations
        cc_op_active_time                          float32  seconds  N  union of CcOp spans
        cc_op_active_time_percent                  float32  percent  N  fraction 0–1
        cc_op_count                                int64    -        N
        cc_cores_instruction_time                  float32  seconds  N  Σ CcInstruction durations
        cc_cores_instruction_active_time           float32  seconds  N  union
        cc_cores_instruction_active_time_percent   float32  percent  N  fraction 0–1
        cc_cores_instruction_count                 int64    -        N
        total_exec_time                            float32  seconds  N  first → last non-setup event
        total_active_time                          float32  seconds  N  union of everything
        total_active_time_percent                  float32  percent  N  fraction 0–1
        """),
    parse_table(
        'SystemProfileEvents', 'timeline', 'system',
        'One host-side event of a system profile: runtime API call, framework op or hardware event.',
        """
        id                     int64          -            Y
        name                   string         -            Y  e.g. nrt_execute
        start_ts               int64          nanoseconds  Y
        end_ts                 int64          nanoseconds  Y
        duration_ns            int64          nanoseconds  Y
        trace_event_source     string         -            Y  neuron_rt, neuron_hw or framework
        instance_id            string         -            Y  EC2 instance id
        process_id             int64          -            Y
        thread_id              int64          -            Y
        nc_idx                 int64          -            N  logical core
        pcore_idx              int64          -            N  physical core within the LNC (0/1 on LNC2)
        worker_gid             int64          -            N  global core id across instances
        flow_id                array<string>  -            N  ids linking related events
        framework_stream_id    string         -            N
        extra_attributes_json  string         -            N  unmapped attributes as JSON text
        """),
    parse_table(
        'SystemProfileHbmUsage', 'samples', 'system',
        'One device-HBM usage sample for one HBM stack, split by allocation category.',
        """
        timestamp                    int64   nanoseconds  Y
        total_bytes                  int64   bytes        Y  sum of categories
        generic_bytes                int64   bytes        Y
        tensor_instructions_bytes    int64   bytes        Y
        scalar_instructions_bytes    int64   bytes        Y
        gpsimd_instructions_bytes    int64   bytes        Y
        io_bytes                     int64   bytes        Y
        dram_spill_bytes             int64   bytes        Y
        weights_bytes                int64   bytes        Y
        profiler_buffers_bytes       int64   bytes        Y
        scalar_table_bytes           int64   bytes        Y
        vector_instructions_bytes    int64   bytes        Y
        sync_instructions_bytes      int64   bytes        Y
        shared_scratchpad_bytes      int64   bytes        Y
        tensors_bytes                int64   bytes        Y
        ucode_lib_bytes              int64   bytes        Y
        gpsimd_stdio_bytes           int64   bytes        Y
        collectives_bytes            int64   bytes        Y
        scratchpad_bytes             int64   bytes        Y
        dma_rings_runtime_bytes      int64   bytes        Y
        dma_rings_spill_bytes        int64   bytes        Y
        dma_rings_io_bytes           int64   bytes        Y
        dma_rings_collectives_bytes  int64   bytes        Y
        unknown_bytes                int64   bytes        Y  unrecognised category
        device_idx                   int64   -            Y  device on the instance
        hbm_idx                      int64   -            Y  HBM stack on the device
        instance_id                  string  -            Y
        """),
    parse_table(
        'SystemProfileMetadata', 'metadata', 'system',
        'The single metadata record of a system profile.',
        """
        first_ts            string  -      Y  text, 2025-12-18 15:35:56.592459482 +0000 UTC
        last_ts             string  -      Y  text form
        first_ts_ns         string  -      Y  Unix ns as string
        last_ts_ns          string  -      Y  Unix ns as string
        ntff_version        int64   -      Y  e.g. 5
        hbm_capacity_bytes  int64   bytes  Y  per NeuronCore
        """),
    parse_table(
        'TensorInfo', 'lookup', 'device',
        'One tensor declared in the NEFF, with statistics on how it was loaded into SBUF.',
        """
        variable_name                  string   -      N  e.g. input0
        type                           string   -      N  IN, OUT or WEIGHT
        format                         string   -      N  layout, e.g. NHWC
        shape                          string   -      N  text, e.g. 128 128 1 1
        size                           int64    bytes  N
        node                           int64    -      N  NEFF node
        pcore_idx                      int64    -      N  physical core within the LNC (0/1 on LNC2)
        load_to_sbuf_avg_size_bytes    int64    -      N  bytes (no unit declared)
        load_to_sbuf_total_size_bytes  int64    -      N  bytes (no unit declared)
        load_to_sbuf_dma_count         int64    -      N  DMAs that loaded it
        load_to_sbuf_repeat_factor     float32  -      N  times loaded into SBUF
        """),
    parse_table(
        'Throttle', 'timeline', 'device',
        'One throttling notification (power/thermal) that caps how busy the engines may be.',
        """
        duration   int64   nanoseconds  Y  name lacks _ns
        k          int32   -            Y  allowed level; limit = k/n
        n          int32   -            Y  max level
        timestamp  int64   nanoseconds  Y
        type       string  -            Y  activity_0, activity_1, unknown
        pcore_idx  int64   -            N  physical core within the LNC (0/1 on LNC2)
        """),
    parse_table(
        'ThrottleSummary', 'summary', 'device',
        'Throttling totals for one NeuronCore and one throttle type.',
        """
        nc_idx                                       int32    -            Y  core within the device
        throttle_type                                string   -            N  activity_0, …
        throttle_active_time_ns                      int64    nanoseconds  N
        throttle_active_time_percent                 float32  percent      N
        max_achievable_util_with_throttling_percent  float32  percent      N  time-weighted utilisation ceiling
        """),
    parse_table(
        'Warning', 'diagnostics', 'any',
        'One warning raised while the profile was processed (check these first).',
        """
        message   string  -  Y
        category  string  -  Y  e.g. Missing Data
        """),
)}
