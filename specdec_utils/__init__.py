"""Helpers for the speculative-decoding course. Each module belongs to a notebook:
models/kv_cache/utils (00), speculative (01), sampling (02), train_draft (drafts), bench (CLI)."""
from .kv_cache import cache_length, trim_cache
from .models import PRESETS, UnknownModelError, get_preset, known_names, load_model
from .utils import (get_device, progress, quick_mode, save_figure, seed_everything, set_plot_style,
                    time_fn, timer)

__all__ = ["load_model", "get_preset", "known_names", "PRESETS", "UnknownModelError",
           "trim_cache", "cache_length", "get_device", "seed_everything", "timer", "time_fn",
           "progress", "quick_mode", "set_plot_style", "save_figure"]
