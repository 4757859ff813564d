"""What one request costs on top of its device execution: the runtime's launch and the host copies.

A device execution (``ExecutionResult.device_time_ns``) starts with its inputs in HBM and ends with
its outputs there. A request made from the host also pays

* the runtime's per-execution overhead: Neuron runtime traces show ~10-13 us between back-to-back
  executions of one core (aws-neuron-sdk#1370, Neuron 2.30 on inf2 with asynchronous execution),
  ``EXECUTION_OVERHEAD_NS``; the device clock leaves the same gap between executions
  (``device.LAUNCH_GAP_NS``);
* the host-to-device copy of its inputs and the device-to-host copy of its outputs, each on the
  chip's one host-transfer DMA engine of that direction (the driver's address map has one
  device->host and one host->device engine per Trn1/Inf2 chip, neuroncore.md §1.1): the DMA fixed
  cost plus the bytes at one engine's practical rate (17 B/ns on NC-v2) [assumption: PCIe is not the
  narrower pipe].

Which outputs go to the host is the caller's to say: a decoder's KV cache stays on the device, only
its logits come back.
"""

from __future__ import annotations

from neuroncore.hardware import CoreSpec

EXECUTION_OVERHEAD_NS = 12_000.0  # aws-neuron-sdk#1370: ~10-13 us between executions (midpoint-ish)


def host_copy_ns(spec: CoreSpec, nbytes: int) -> float:
    """One host<->device copy of ``nbytes`` on one host-transfer DMA engine (0 for nothing)."""
    if nbytes <= 0:
        return 0.0
    return spec.dma_fixed_latency_ns + nbytes * 1e9 / spec.dma_engine_bytes_per_s


def request_latency_ns(spec: CoreSpec, device_ns: float, input_bytes: int, output_bytes: int) -> float:
    """Host-observed latency of one request: launch, input copy, execution, output copy, in series."""
    return (EXECUTION_OVERHEAD_NS + host_copy_ns(spec, input_bytes) + device_ns
            + host_copy_ns(spec, output_bytes))


__all__ = ["EXECUTION_OVERHEAD_NS", "host_copy_ns", "request_latency_ns"]
