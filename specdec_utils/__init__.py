"""Helpers for the speculative-decoding course. Each module belongs to a notebook:
models/kv_cache/utils (00), speculative (01), sampling (02), engine/methods/policies (03, 04),
stop_head (04), exactness (02-05), train_draft (drafts), bench (CLI).

`generate(target, input_ids, max_new_tokens, method=...)` is the one entry point for every method."""
import os as _os
import sys as _sys

import torch as _torch

# Without a GPU, notebook 07's Triton kernels run in Triton's CPU interpreter. Triton reads
# TRITON_INTERPRET when it is first imported (transformers imports it below), so it is set here.
TRITON_IMPORTED_TOO_EARLY = False
if not _torch.cuda.is_available() and "TRITON_INTERPRET" not in _os.environ:
    TRITON_IMPORTED_TOO_EARLY = "triton" in _sys.modules
    _os.environ["TRITON_INTERPRET"] = "1"

from .kv_cache import cache_length, trim_cache  # noqa: E402
from .methods import METHODS, generate
from .models import PRESETS, UnknownModelError, get_preset, known_names, load_model
from .utils import (get_device, progress, quick_mode, save_figure, seed_everything, set_plot_style,
                    time_fn, timer)

__all__ = ["generate", "METHODS", "load_model", "get_preset", "known_names", "PRESETS", "UnknownModelError",
           "trim_cache", "cache_length", "get_device", "seed_everything", "timer", "time_fn",
           "progress", "quick_mode", "set_plot_style", "save_figure"]
