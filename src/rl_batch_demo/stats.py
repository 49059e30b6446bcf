"""Statistics: percentiles and their descriptions."""

from __future__ import annotations

import math
from typing import Any, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks, index (n-1)*q (NumPy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    return sorted_percentile(sorted(values), q)


def sorted_percentile(ordered: Sequence[float], q: float) -> float:
    """percentile() of values already sorted: a hundred thousand of them are not copied again."""
    position = (len(ordered) - 1) * q
    lower = math.floor(position)
    upper = math.ceil(position)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def describe(
    values: Sequence[float], missing: int = 0, ordered: Sequence[float] | None = None
) -> dict:
    """P50/P95/P99/max/mean of a sample, with its size and how many were missing (`ordered`:
    the values sorted already)."""
    summary: dict[str, Any] = {"samples": len(values), "missing": missing}
    if values:
        ordered = sorted(values) if ordered is None else ordered
        summary.update(
            {
                "p50": rounded(sorted_percentile(ordered, 0.50)),
                "p95": rounded(sorted_percentile(ordered, 0.95)),
                "p99": rounded(sorted_percentile(ordered, 0.99)),
                "max": rounded(max(values)),
                "mean": rounded(sum(values) / len(values)),
            }
        )
    return summary
