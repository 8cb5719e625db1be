"""Each transformers-internal piece of `specdec_utils.compat`, checked against the installed version.
Run this file first after upgrading transformers."""
import pytest
import torch
from transformers import DynamicCache

from specdec_utils import compat
from specdec_utils.models import tiny_model

from conftest import random_prompt


@pytest.fixture(scope="module")
def model():
    return tiny_model("tiny-llama", vocab_size=64, seed=0).eval()


def test_the_installed_version_is_one_whose_internals_were_checked():
    assert compat.tested(), (f"transformers {compat.VERSION} is not in compat.TESTED {compat.TESTED}: run this file, "
                             f"then add it")


def test_an_old_transformers_is_refused_with_one_line(monkeypatch):
    monkeypatch.setattr(compat, "VERSION", compat.Version("5.3.0"))
    with pytest.raises(ImportError, match=r"needs transformers >= 5\.17.*found"):
        compat.require()


def test_the_cache_layer_interface_the_static_cache_overrides_is_there():
    for name in compat.LAYER_ATTRIBUTES:
        assert hasattr(compat.CacheLayer(), name), name
    layers = [compat.CacheLayer() for _ in range(2)]
    assert compat.Cache(layers=layers).layers == layers


def test_a_negative_crop_removes_positions_and_crop_zero_is_refused(model):
    ids = random_prompt(10, seed=1, vocab=64)
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True, past_key_values=DynamicCache()).past_key_values
        keys = cache.layers[0].keys.clone()
        compat.crop_cache(cache, 3)
    assert cache.get_seq_length() == 7
    assert torch.equal(cache.layers[0].keys, keys[..., :7, :])
    with pytest.raises(ValueError, match="remove must be > 0"):
        compat.crop_cache(cache, 0)


def test_a_registered_attention_runs_and_sdpa_is_the_fallback(model):
    calls = []

    def counting(module, query, key, value, attention_mask, **kwargs):
        calls.append(query.shape)
        return compat.sdpa_attention(module, query, key, value, attention_mask, **kwargs)

    compat.register_attention("course_counting", counting)
    ids = random_prompt(6, seed=2, vocab=64)
    with torch.no_grad():
        reference = model(input_ids=ids).logits
        previous = compat.attn_implementation(model)
        model.set_attn_implementation("course_counting")
        try:
            assert compat.attn_implementation(model) == "course_counting"
            logits = model(input_ids=ids).logits
        finally:
            model.set_attn_implementation(previous)
    assert len(calls) == model.config.num_hidden_layers
    torch.testing.assert_close(logits, reference)


def test_user_4d_masks_reach_sdpa_unchanged_additive_and_boolean(model):
    ids = random_prompt(7, seed=3, vocab=64)
    n = ids.shape[1]
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    additive = torch.zeros(n, n).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        causal = model(input_ids=ids).logits
        from_float = model(input_ids=ids, attention_mask=additive[None, None]).logits
        from_bool = model(input_ids=ids, attention_mask=allowed[None, None]).logits
        # a mask that is not causal must change the output: the mask really is used as given
        lone = torch.eye(n, dtype=torch.bool)
        diagonal = model(input_ids=ids, attention_mask=lone[None, None]).logits
    torch.testing.assert_close(from_float, causal)
    torch.testing.assert_close(from_bool, causal)
    assert not torch.allclose(diagonal[0, -1], causal[0, -1])


def test_full_vocab_config_shows_the_full_size_and_restores_it():
    config = type("Config", (), {"vocab_size": 100, "full_vocab_size": 49152})()
    draft = type("Draft", (), {"config": config})()
    with compat.full_vocab_config(draft):
        assert draft.config.vocab_size == 49152
    assert draft.config.vocab_size == 100


def test_saveable_config_drops_the_gguf_quantization_entry(model):
    config = model.config
    config.quantization_config = {"quant_method": "gguf"}
    assert not hasattr(compat.saveable_config(config), "quantization_config")
