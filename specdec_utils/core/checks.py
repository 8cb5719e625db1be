"""The package's one set of argument checks: a bad argument gets one line naming it and what is allowed."""
from __future__ import annotations

import math
import numbers

import torch


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


# --------------------------------------------------------------------------- the rules every copy shares
# The engine (`engine.check_arguments`), the device loop (`device_loop.DeviceLoop`) and `sampling.warp_logits` call
# these, so that an argument one of them takes the others take too, and is refused by all in the same words.
MIN_TEMPERATURE = 1e-6  # below it a float32 warp divides by a number that rounds to 0 (or nearly): NaN or inf


def check_temperature(temperature) -> None:
    """0 (greedy) or a finite real number >= `MIN_TEMPERATURE` (not a bool)."""
    require("temperature", temperature, is_number(temperature, 0.0) and math.isfinite(temperature)
            and (temperature == 0 or temperature >= MIN_TEMPERATURE),
            "a finite number >= 0 (0 means greedy; a positive one must be >= 1e-6)")


def check_top_k(top_k) -> None:
    """An integer >= 0 (not a bool); 0 means off."""
    require("top_k", top_k, is_count(top_k, 0), "an integer >= 0 (0 means off)")


def check_top_p(top_p) -> None:
    """A real number in (0, 1] (not a bool); 1.0 means off."""
    require("top_p", top_p, is_number(top_p) and 0 < top_p <= 1, "a number in (0, 1] (1.0 means off)")


def check_sampling(temperature, top_k, top_p) -> None:
    """The warping's settings (`sampling.warp_logits`): temperature, then top-k, then top-p."""
    check_temperature(temperature)
    check_top_k(top_k)
    check_top_p(top_p)


def check_count(name: str, value, low: int = 1, allowed: str | None = None) -> None:
    """An integer >= `low` (a Python or numpy integer, not a bool): max_new_tokens, gamma, a tree's sizes."""
    require(name, value, is_count(value, low), allowed or f"an integer >= {low}")


def check_prompt_ids(ids) -> None:
    """Token ids of one prompt (any shape the caller has already checked): an integer dtype, at least one token."""
    if ids.numel() < 1:
        raise ValueError("input_ids must hold at least one token")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
