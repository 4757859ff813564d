"""Values from a profile as JSON: the one conversion every JSON writer uses.

A profile's cells come from Parquet files that may have been written by another tool, or damaged: a
``Summary`` column can hold a DuckDB ``Decimal`` sum, a NaN, raw bytes or a date where a number was
expected. ``json.dumps`` raises on most of those (a traceback instead of output), so every writer
passes its values through :func:`json_value` first.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any


def json_value(value: Any) -> Any:
    """A JSON-safe stand-in for one cell: exact Decimal sums as int (else float), NaN and ±Inf as
    null, bytes as hex, dates and times in ISO 8601, anything else unknown as its text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, Decimal):
        if not value.is_finite():
            return None
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    return str(value)
