"""The package's one set of argument checks: a bad argument gets one line naming it and what is allowed."""
from __future__ import annotations

import math
import numbers


def require(name: str, value, ok: bool, allowed: str) -> None:
    """Raise `ValueError("{name} must be {allowed}, got {value!r}")` unless `ok`."""
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def is_int(value) -> bool:
    """An integer (a Python or numpy integer, not a bool)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_count(value, low: int = 1) -> bool:
    """An integer >= `low`."""
    return is_int(value) and value >= low


def is_number(value, low: float = -math.inf, high: float = math.inf) -> bool:
    """A real number (not a bool) in [low, high]."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and low <= value <= high
