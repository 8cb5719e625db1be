"""Helpers for the speculative-decoding course.

`generate(target, input_ids, max_new_tokens, method=...)` is the one entry point for every method;
`load_model(name)` loads the target, the drafts and test models. The folders show the architecture:

- `core/`: what runs at decode time. The loop (`engine`), verification and commit (`verify`), sampling,
  caches and model runners (`kv_cache`, `static_cache`, `runner`), proposers and policies (`engine`,
  `policies`, `hierarchy`, `tree_drafting`, `medusa`, `ngram`, `stop_head`), trees (`tree`,
  `tree_attention`), and the method registry with `generate` (`methods`).
- `tools/`: what measures or trains: the bench CLI (`python -m specdec_utils.bench`), the leaderboard,
  the GPU benchmarks, the trainers of the drafts and heads, README's tables.
- at the top: models and prompts, the transformers-internal pieces (`compat`), teaching facades and
  checks for the notebooks (`speculative`, `exactness`, `theory`, `report`, `utils`).

Importing the package changes nothing global (no environment variables, no logging switches)."""
from .core.kv_cache import cache_length, trim_cache
from .core.methods import METHODS, generate
from .models import PRESETS, UnknownModelError, get_preset, known_names, load_model
from .utils import get_device, progress, quick_mode, save_figure, seed_everything, set_plot_style, time_fn, timer

__all__ = ["generate", "METHODS", "load_model", "get_preset", "known_names", "PRESETS", "UnknownModelError",
           "trim_cache", "cache_length", "get_device", "seed_everything", "timer", "time_fn",
           "progress", "quick_mode", "set_plot_style", "save_figure"]
