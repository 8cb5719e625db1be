"""Helpers for the speculative-decoding course.

`generate(target, input_ids, max_new_tokens, method=...)` is the one entry point for every method;
`load_model(name)` loads the target, the drafts and test models. The layout:

- `core/`: what runs at decode time. The loop (`engine`), verification (`verify`), the math of a round as tensor
  functions of explicit inputs (`sampling`, `kv_cache`), caches, model runners and CUDA graphs (`static_cache`,
  `runner`, `graphs`), the method families (`policies`, `hierarchy`, `ngram`, `tree_drafting`, `medusa`, `eagle`,
  `block`, `stop_head`), trees as pure structure (`tree`) and their Triton kernels (`tree_attention`), the method
  registry with `generate` (`methods`: a family is imported when its method is first used, so a `draft` run
  imports no EAGLE, Medusa or tree kernels), and the recorded executor (`device_loop`: `executor=DeviceExecutor()`).
- at the top: models and prompts, transformers' internals (`compat`), measuring and training as the lessons run
  them (`measure`, `step_costs`, `leaderboard`: reading the boards, `training`, `objectives`), and the notebooks'
  facades and checks (`speculative`, `exactness`, `theory`, `report`, `utils`).
- the lab, `specdec_lab/` beside this package: the bench CLI (`python -m specdec_lab.bench`), the leaderboard runs,
  the GPU benchmarks, the trainers, README's tables. It imports this package; this package never imports it.

Importing the package changes nothing global (no environment variables, no logging switches), and it is light:
`import specdec_utils` imports no torch, transformers or submodule. A public name below, or a submodule, is imported
the first time it is used (`from specdec_utils import generate`, `specdec_utils.models`: PEP 562)."""
import importlib

# public name -> the module that defines it
_EXPORTS = {
    "generate": ".core.methods", "METHODS": ".core.methods",
    "load_model": ".models", "get_preset": ".models", "known_names": ".models", "PRESETS": ".models",
    "UnknownModelError": ".models",
    "trim_cache": ".core.kv_cache", "cache_length": ".core.kv_cache",
    "get_device": ".utils", "seed_everything": ".utils", "timer": ".utils", "time_fn": ".utils", "progress": ".utils",
    "quick_mode": ".utils", "set_plot_style": ".utils", "save_figure": ".utils",
    "default_dtype": ".utils", "low_precision_dtype": ".utils",
}

__all__ = ["generate", "METHODS", "load_model", "get_preset", "known_names", "PRESETS", "UnknownModelError",
           "trim_cache", "cache_length", "get_device", "seed_everything", "timer", "time_fn",
           "progress", "quick_mode", "set_plot_style", "save_figure", "default_dtype", "low_precision_dtype"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value  # the next access is a plain attribute
        return value
    if not name.startswith("_"):  # a submodule not imported yet (`specdec_utils.models` after `import specdec_utils`)
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
