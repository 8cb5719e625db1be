"""Helpers for the speculative-decoding course. Each module belongs to a notebook:
models/kv_cache/utils (00), speculative (01), sampling (02), engine/methods/policies (03, 04),
stop_head (04), exactness (02-05), train_draft (drafts), bench (CLI).

`generate(target, input_ids, max_new_tokens, method=...)` is the one entry point for every method."""
from .kv_cache import cache_length, trim_cache
from .methods import METHODS, generate
from .models import PRESETS, UnknownModelError, get_preset, known_names, load_model
from .utils import (get_device, progress, quick_mode, save_figure, seed_everything, set_plot_style,
                    time_fn, timer)

__all__ = ["generate", "METHODS", "load_model", "get_preset", "known_names", "PRESETS", "UnknownModelError",
           "trim_cache", "cache_length", "get_device", "seed_everything", "timer", "time_fn",
           "progress", "quick_mode", "set_plot_style", "save_figure"]
