"""Every place the package leans on transformers internals, in one module.

transformers changes its internals between minor releases; the course runs on 5.17 (the GPU machine) and
5.23 (the CPU machines). Each piece below names what it relies on, is checked against the installed
version when first used (`require`, one clear error line instead of a wrong answer later), and has a
focused test in tests/test_compat.py, which is what to run after upgrading transformers.

- `CacheLayer`, `Cache` (`core/static_cache.py`): `cache_utils.DynamicLayer` with `keys`, `values`,
  `is_initialized`, `lazy_initialization`, `crop`; the `Cache(layers=...)` constructor.
- `crop_cache` (`core/kv_cache.py`): `DynamicCache.crop(-n)` removes n positions (a positive n meant
  "keep n" in older releases).
- `register_attention`, `sdpa_attention`, `attn_implementation` (`core/tree_attention.py`):
  `AttentionInterface.register`, `masking_utils.AttentionMaskInterface` and `sdpa_mask`,
  `integrations.sdpa_attention.sdpa_attention_forward`, `config._attn_implementation`.
- user 4D masks (`core/tree.py`, `core/runner.py`): a 4D `attention_mask` reaches the attention function
  unchanged, so an additive float mask (the tree pass) and a boolean one (the graphed step) both work
  with SDPA (not with "eager" attention, which would add a boolean mask to the scores).
- `full_vocab_config` (`specdec_lab/bench.py`, `hf-assisted`): assisted generation picks its candidate
  generator by comparing `config.vocab_size`.
- `saveable_config` (`models.py`): a GGUF-loaded config carries a `quantization_config` that refuses
  `save_pretrained`.
"""
from __future__ import annotations

from contextlib import contextmanager

import transformers
from packaging.version import Version
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

TESTED = ("5.17", "5.23")  # major.minor versions whose internals tests/test_compat.py checked
MINIMUM = Version("5.17")
VERSION = Version(transformers.__version__)


def require() -> None:
    """Fail with one line if the installed transformers is older than the course supports."""
    if VERSION < MINIMUM:
        raise ImportError(f"specdec_utils needs transformers >= {MINIMUM} (its cache and attention internals), "
                          f"found {transformers.__version__}; pip install -r requirements.txt")


def tested() -> bool:
    """True when the installed version is one whose internals were checked (others may work: run
    tests/test_compat.py)."""
    return f"{VERSION.major}.{VERSION.minor}" in TESTED


require()

# ---------------------------------------------------------------------------------------- caches
CacheLayer = DynamicLayer  # the preallocated layer overrides update / get_seq_length / crop, keeps the rest
LAYER_ATTRIBUTES = ("keys", "values", "is_initialized", "lazy_initialization", "update", "get_seq_length", "crop")
__all__ = ["Cache", "CacheLayer", "DynamicCache", "crop_cache", "register_attention", "sdpa_attention",
           "attn_implementation", "full_vocab_config", "saveable_config", "require", "tested"]


def crop_cache(cache, remove: int) -> None:
    """Remove the last `remove` (> 0) positions of a transformers cache in place (`crop(-n)`: the meaning
    of a negative argument is the same on every supported version; a positive one changed)."""
    if remove <= 0:
        raise ValueError(f"remove must be > 0 (crop(0) empties a cache in the legacy API), got {remove}")
    cache.crop(-remove)


# ------------------------------------------------------------------------------------- attention
def register_attention(name: str, function) -> None:
    """Make `function` the attention of `model.set_attn_implementation(name)`, with SDPA's mask builder."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, sdpa_mask)


def sdpa_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' own SDPA attention function (what a registered backend falls back to)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def attn_implementation(model) -> str | None:
    """The attention implementation a model runs ("sdpa", "eager", a registered name)."""
    return getattr(model.config, "_attn_implementation", None)


# ----------------------------------------------------------------------------- models and configs
@contextmanager
def full_vocab_config(draft):
    """Hugging Face's assisted generation takes a `config.vocab_size` different from the target's for a
    different tokenizer (and then switches to its universal-assisted path). Our reduced-vocabulary drafts
    report their small head there but read and write full-vocabulary ids, so show the full size for the
    duration of the call."""
    full_vocab_size = getattr(draft.config, "full_vocab_size", None)
    reduced_vocab_size = draft.config.vocab_size
    if full_vocab_size:
        draft.config.vocab_size = full_vocab_size
    try:
        yield draft
    finally:
        draft.config.vocab_size = reduced_vocab_size


def saveable_config(config):
    """A GGUF-loaded config without its `quantization_config` (the weights are dequantized already;
    `save_pretrained` refuses a quantization it cannot write back)."""
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config
