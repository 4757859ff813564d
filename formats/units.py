"""One unit convention for every view (summary-text, the terminal viewer, the GUI, neuron-top, Perfetto).

    from formats.units import fmt_bytes, fmt_rate, fmt_pct, fmt_ns, fmt_count, fmt_flops

The convention, chosen once (docs/figures.md, "Units"):

* **sizes** in binary units, spelled as IEC does: ``B``, ``KiB``, ``MiB``, ``GiB``, ``TiB``, ``PiB``
  (1 KiB = 1024 B). Memory is allocated in powers of two, so capacities read as round numbers
  (``16.0 GiB`` of HBM), and the suffix says which base it is -- never a bare ``KB``.
* **throughput** in decimal bytes per second (``GB/s``, 1 GB/s = 1e9 B/s), as bandwidths are quoted
  by hardware specs (``hbm_ddr_bandwidth``, NeuronLink); :func:`fmt_rate` scales to kB/s, MB/s, GB/s,
  TB/s. ``fmt_gbps`` always says GB/s (columns that compare rates).
* **fractions** (every ``*_percent`` field of the Summary is a fraction in [0, 1]) are shown as
  percentages: ``fmt_pct(0.316) == "31.6%"``; values already in 0-100 (neuron-monitor's
  ``neuroncore_utilization``) go through :func:`fmt_percent_value`.
* **durations** in the unit that keeps three significant digits: ``ns``, ``µs``, ``ms``, ``s``.
* **counts** exact below 10,000, then with a suffix (``15.2k``, ``152k``, ``1.97M``, ``3.4G``): at
  most 5 characters, so a column of counts never runs into its neighbour; :func:`count_cell` pads to
  a width and always leaves one blank in front.
* **FLOPs** with decimal prefixes (``1.23 GFLOP``), FLOP rates as ``TFLOP/s``.
* unknown values print as ``-`` (:data:`UNKNOWN`), never as 0.

Every function takes ``None`` for unknown. ``explorer.viewer.text`` and ``explorer.top.fmt`` re-export
what they used to define themselves, so there is one implementation.
"""

from __future__ import annotations

import math
from typing import TypeGuard

__all__ = [
    "BINARY_UNITS", "UNKNOWN", "count_cell", "fmt_bytes", "fmt_count", "fmt_flops", "fmt_flops_rate",
    "fmt_gbps", "fmt_ns", "fmt_pct", "fmt_percent_value", "fmt_rate", "fmt_seconds", "percent_cell",
]

UNKNOWN = "-"
BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_DECIMAL_RATE = (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3))
_FLOP_PREFIX = (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def _known(value: float | None) -> TypeGuard[float]:
    """Not None and not NaN (a TypeGuard, so callers read ``float(value)`` without a cast)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def fmt_bytes(count: float | None, *, digits: int = 1, space: bool = True) -> str:
    """Bytes in binary units: ``fmt_bytes(332e6) == "316.6 MiB"``, ``fmt_bytes(512) == "512 B"``.

    ``digits`` decimals above 1 KiB (plain bytes are whole); ``space=False`` gives ``316.6MiB`` for
    narrow table cells. Rounding never prints ``1024.0 KiB``: it moves to the next unit."""
    if not _known(count):
        return UNKNOWN
    value = float(count)
    sign = "-" if value < 0 else ""
    value = abs(value)
    unit = 0
    while value >= 1024.0 and unit < len(BINARY_UNITS) - 1:
        value /= 1024.0
        unit += 1
    gap = " " if space else ""
    if unit == 0:
        return f"{sign}{value:.0f}{gap}B"
    text = f"{value:.{digits}f}"
    if float(text) >= 1024.0 and unit < len(BINARY_UNITS) - 1:
        text, unit = f"{value / 1024.0:.{digits}f}", unit + 1
    return f"{sign}{text}{gap}{BINARY_UNITS[unit]}"


def fmt_rate(bytes_per_s: float | None, *, space: bool = True) -> str:
    """Throughput in decimal units: ``fmt_rate(2.5e10) == "25.0 GB/s"``, ``"512 B/s"`` when tiny."""
    if not _known(bytes_per_s):
        return UNKNOWN
    value = float(bytes_per_s)
    gap = " " if space else ""
    for unit, scale in _DECIMAL_RATE:
        if abs(value) >= scale:
            return f"{value / scale:.1f}{gap}{unit}"
    return f"{value:.0f}{gap}B/s"


def fmt_gbps(bytes_per_s: float | None, *, digits: int = 2) -> str:
    """Throughput always in GB/s (decimal): ``fmt_gbps(3.3e8) == "0.33 GB/s"``."""
    if not _known(bytes_per_s):
        return UNKNOWN
    return f"{float(bytes_per_s) / 1e9:.{digits}f} GB/s"


def fmt_pct(fraction: float | None) -> str:
    """A fraction in [0, 1] as a percentage, the one way every view prints a fraction figure
    (MFU, training MFU, engine and DMA active ...): one decimal from 1 % up (``fmt_pct(0.316) ==
    "31.6%"``), two below it, where one would lose the figure (``fmt_pct(0.0006) == "0.06%"``, not
    "0.1%": a small model's MFU); a non-zero value that would round to 0 prints as ``<0.01%``
    (never a misleading ``0.00%``). No view picks its own precision: the same value is the same
    string in summary-text, the terminal viewer, the GUI and exports."""
    if not _known(fraction):
        return UNKNOWN
    percent = 100.0 * float(fraction)
    return fmt_percent_value(percent, digits=1 if percent == 0 or abs(percent) >= 0.995 else 2)


def fmt_percent_value(percent: float | None, *, digits: int = 1) -> str:
    """A value already in percent (0-100): ``fmt_percent_value(9.3) == "9.3%"``."""
    if not _known(percent):
        return UNKNOWN
    value = float(percent)
    smallest = 10.0 ** -digits
    if value != 0 and abs(value) < smallest / 2:
        return f"<{smallest:.{digits}f}%"
    return f"{value:.{digits}f}%"


def percent_cell(percent: float | None) -> str:
    """A fixed 6-character percent cell for live tables (value in 0-100): ``" 9.30%"``, ``"  100%"``
    above 99.995 (never 7 characters), ``"    --"`` unknown. neuron-top's grid uses it."""
    if not _known(percent):
        return "    --"
    value = float(percent)
    text = f"{max(value, 0.0):5.2f}"
    if value > 99.995 or text == "100.00":
        return "  100%"
    return text + "%"


def fmt_ns(ns: float | None) -> str:
    """A duration in the unit that keeps three significant digits: ``fmt_ns(1234) == "1.23 µs"``."""
    if not _known(ns):
        return UNKNOWN
    value = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} ns"


def fmt_seconds(seconds: float | None) -> str:
    """A duration given in seconds (Summary ``*_time`` columns), same convention as :func:`fmt_ns`."""
    return UNKNOWN if not _known(seconds) else fmt_ns(float(seconds) * 1e9)


def fmt_count(count: float | None) -> str:
    """A count in at most 5 characters: exact below 10,000, then ``15.2k``, ``152k``, ``1.97M``,
    ``19.7M``, ``197M``, ``1.97G``."""
    if not _known(count):
        return UNKNOWN
    n = float(count)
    if abs(n) < 10_000:
        return f"{n:.0f}"
    suffixes = (("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12))
    index = max(i for i, (_, scale) in enumerate(suffixes) if abs(n) >= scale)
    while True:
        unit, scale = suffixes[index]
        scaled = n / scale
        text = f"{scaled:.0f}" if abs(scaled) >= 99.95 else f"{scaled:.1f}" if abs(scaled) >= 9.995 \
            else f"{scaled:.2f}"
        if abs(float(text)) < 1000 or index == len(suffixes) - 1:
            return text + unit  # 999,600 -> "1.00M", never "1000k"
        index += 1


def count_cell(count: float | None, width: int) -> str:
    """A count right-aligned in ``width`` characters with at least one blank in front, so adjacent
    count columns never run together (``152k1970115098``)."""
    text = fmt_count(count)
    return text.rjust(max(width, len(text) + 1))


def fmt_flops(flops: float | None) -> str:
    """FLOPs with a decimal prefix: ``fmt_flops(1.23e9) == "1.23 GFLOP"``."""
    if not _known(flops):
        return UNKNOWN
    value = float(flops)
    for prefix, scale in _FLOP_PREFIX:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}FLOP"
    return f"{value:.0f} FLOP"


def fmt_flops_rate(flops_per_s: float | None, *, digits: int = 2) -> str:
    """A FLOP rate in TFLOP/s: ``fmt_flops_rate(1.9e14) == "190.00 TFLOP/s"``."""
    if not _known(flops_per_s):
        return UNKNOWN
    return f"{float(flops_per_s) / 1e12:.{digits}f} TFLOP/s"
