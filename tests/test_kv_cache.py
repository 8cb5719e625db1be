"""Tests of specdec_utils.core.kv_cache: KV-cache rollback on real caches and on stubs of the APIs that
transformers changed under us (crop(n) "keep n" in 5.17, "positive n raises" in 5.23)."""
import pytest
import torch

from specdec_utils.core.kv_cache import cache_length, trim_cache
from specdec_utils.models import tiny_model

VOCAB = 256
SEQ = 16
MODELS = ("tiny-llama", "tiny-gpt2")


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return tiny_model(request.param, vocab_size=VOCAB).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def forward(model, ids, cache=None):
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    return out.logits, out.past_key_values


# --- real transformers DynamicCache -------------------------------------------------------------

@pytest.mark.parametrize("length", [0, 1, 7, SEQ - 1, SEQ])
def test_rollback_then_forward_matches_fresh_forward(model, ids, length):
    full_logits, cache = forward(model, ids)
    assert cache_length(cache) == SEQ
    cache = trim_cache(cache, length)
    assert cache_length(cache) == length
    if length < SEQ:
        logits, cache = forward(model, ids[:, length:], cache)
        torch.testing.assert_close(logits, full_logits[:, length:], atol=1e-5, rtol=1e-5)
        assert cache_length(cache) == SEQ


def test_rollback_of_rejected_tokens(model, ids):
    """The speculative-decoding pattern: drafted tokens are rejected and replaced by others."""
    prefix, drafted, replacement = ids[:, :8], ids[:, 8:13], torch.flip(ids[:, 8:11], dims=[1])
    _, cache = forward(model, torch.cat([prefix, drafted], dim=1))
    cache = trim_cache(cache, prefix.shape[1])
    logits, cache = forward(model, replacement, cache)
    fresh_logits, _ = forward(model, torch.cat([prefix, replacement], dim=1))
    torch.testing.assert_close(logits, fresh_logits[:, prefix.shape[1]:], atol=1e-5, rtol=1e-5)
    assert cache_length(cache) == prefix.shape[1] + replacement.shape[1]


def test_trim_by_zero_is_a_no_op(model, ids):
    full_logits, cache = forward(model, ids[:, :10])
    keys_before = [layer.keys.clone() for layer in cache.layers]
    assert trim_cache(cache, 10) is cache
    assert cache_length(cache) == 10
    assert all(torch.equal(layer.keys, k) for layer, k in zip(cache.layers, keys_before))
    logits, _ = forward(model, ids[:, 10:], cache)
    reference, _ = forward(model, ids)
    torch.testing.assert_close(logits, reference[:, 10:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [-1, SEQ + 1, 100])
def test_out_of_range_lengths_raise(model, ids, length):
    _, cache = forward(model, ids)
    with pytest.raises(ValueError, match="cannot trim"):
        trim_cache(cache, length)
    assert cache_length(cache) == SEQ  # untouched


def test_cache_length_of_empty_things():
    assert cache_length(None) == 0
    assert cache_length(()) == 0


# --- stubs of the two crop() APIs, a cache without crop(), legacy tuples -------------------------

class StubLayer:
    def __init__(self, seq_len, heads=2, head_dim=4):
        positions = torch.arange(seq_len, dtype=torch.float32).view(1, 1, seq_len, 1)
        self.keys = positions.expand(1, heads, seq_len, head_dim).clone()
        self.values = -self.keys


class StubCacheNoCrop:
    """A cache object with layers but no crop(): trim_cache refuses it (slicing a layer behind a cache's back
    could hide a real failure)."""

    def __init__(self, seq_len, num_layers=3):
        self.layers = [StubLayer(seq_len) for _ in range(num_layers)]

    def get_seq_length(self):
        return self.layers[0].keys.shape[-2]

    def _keep(self, n):
        for layer in self.layers:
            layer.keys, layer.values = layer.keys[..., :n, :], layer.values[..., :n, :]


class StubCache517(StubCacheNoCrop):
    """transformers <= 5.17: crop(n >= 0) keeps n tokens (so crop(0) empties), crop(n < 0) removes |n|."""

    def crop(self, n):
        self._keep(n if n >= 0 else self.get_seq_length() + n)


class StubCache523(StubCacheNoCrop):
    """transformers >= 5.2x: crop(n > 0) raises, crop(n <= 0) removes |n| tokens."""

    def crop(self, n):
        if n > 0:
            raise ValueError(f"Calling `crop` with a positive value (`{n}`) is not supported.")
        if n < 0:
            self._keep(self.get_seq_length() + n)


class StubCacheBroken(StubCacheNoCrop):
    """A crop() that silently does nothing: trim_cache must notice instead of going on."""

    def crop(self, n):
        pass


STUBS = (StubCacheNoCrop, StubCache517, StubCache523)


@pytest.mark.parametrize("cache_cls", STUBS)
@pytest.mark.parametrize("length", [0, 1, 5, 9, 10])
def test_stub_caches_trim_to_the_right_length(cache_cls, length):
    if cache_cls is StubCacheNoCrop and length < 10:  # no crop(): refused in one line, never sliced behind its back
        with pytest.raises(ValueError, match="needs rollback"):
            trim_cache(cache_cls(10), length)
        return
    cache = trim_cache(cache_cls(10), length)
    assert cache_length(cache) == length
    for layer in cache.layers:
        assert layer.keys.shape[-2] == layer.values.shape[-2] == length
        assert torch.equal(layer.keys[0, 0, :, 0], torch.arange(length, dtype=torch.float32))


@pytest.mark.parametrize("cache_cls", STUBS)
def test_stub_trim_by_zero_keeps_everything(cache_cls):
    # With the 5.17 API a naive cache.crop(0) would empty the cache.
    assert cache_length(trim_cache(cache_cls(10), 10)) == 10


@pytest.mark.parametrize("cache_cls", STUBS)
def test_stub_out_of_range_raises(cache_cls):
    for length in (-1, 11):
        with pytest.raises(ValueError):
            trim_cache(cache_cls(10), length)


def test_broken_crop_is_detected():
    with pytest.raises(RuntimeError, match="rollback failed"):
        trim_cache(StubCacheBroken(10), 4)


def legacy_cache(seq_len, num_layers=3):
    return tuple((layer.keys, layer.values) for layer in (StubLayer(seq_len) for _ in range(num_layers)))


@pytest.mark.parametrize("length", [0, 3, 10])
def test_legacy_tuple_cache(length):
    cache = legacy_cache(10)
    trimmed = trim_cache(cache, length)
    assert isinstance(trimmed, tuple) and len(trimmed) == len(cache)
    assert cache_length(trimmed) == length
    for (k, v), (k0, v0) in zip(trimmed, cache):
        assert torch.equal(k, k0[..., :length, :]) and torch.equal(v, v0[..., :length, :])
    assert cache_length(cache) == 10  # the original tuple is unchanged


def test_legacy_tuple_out_of_range_raises():
    with pytest.raises(ValueError):
        trim_cache(legacy_cache(10), 11)
