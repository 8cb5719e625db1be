"""Invariants that must fail loudly or hold under concurrency: the target cache is built whole even when two
conversions race; the EAGLE head's cache buffers stay writable outside inference mode; a cache crop, a runner's
commit and a pooled ratio raise on impossible arguments instead of clamping them."""
import os
import threading

import pytest
import torch

from specdec_utils import models, report
from specdec_utils.compat import crop_cache
from specdec_utils.core import eagle
from specdec_utils.core.hidden import capture_hidden
from specdec_utils.core.plain_llama import PlainRunner
from specdec_utils.core.static_cache import StaticKVCache
from specdec_utils.models import tiny_model

pytestmark = pytest.mark.usefixtures("single_thread")


# ----------------------------------------------------------------------------- the target cache
@pytest.fixture
def fake_conversion(monkeypatch):
    """`ensure_target_cache` with a conversion that writes a finished cache's two files, each holding the writer's
    name (the thread's), in place of the 98 MB GGUF's."""
    monkeypatch.setenv("SPECDEC_GGUF", "/nowhere/target.gguf")
    before_rename = []  # optional hooks, run inside the conversion once its files are written

    def convert(gguf, folder):
        folder.mkdir(exist_ok=True)
        name = threading.current_thread().name
        (folder / "model.safetensors").write_text(name)
        for hook in before_rename:
            hook()
        (folder / "tokenizer.json").write_text(name)
    monkeypatch.setattr(models, "_convert_target", convert)
    return before_rename


def whole(out) -> str:
    """The writer of the cache `out`, asserting that one writer wrote all of it."""
    writer = (out / "model.safetensors").read_text()
    assert (out / "tokenizer.json").read_text() == writer
    return writer


def test_two_conversions_at_once_both_get_the_whole_cache(tmp_path, fake_conversion):
    barrier = threading.Barrier(2, timeout=30)
    fake_conversion.append(barrier.wait)  # both have written half of their cache before either goes on
    results, errors = {}, []

    def convert():
        try:
            results[threading.current_thread().name] = models.ensure_target_cache(tmp_path)
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(repr(err))
    threads = [threading.Thread(target=convert, name=name) for name in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    out = tmp_path / models.TARGET_NAME
    assert results == {"first": out, "second": out}
    assert whole(out) in ("first", "second")
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary folder left


def test_a_conversion_that_loses_the_race_uses_the_winners_cache(tmp_path, fake_conversion, monkeypatch):
    """Another process's finished cache lands between our conversion and our rename: ours goes, theirs stays."""
    out = tmp_path / models.TARGET_NAME
    real_rename = os.rename

    def another_process_first(src, dst):
        os.mkdir(dst)
        for name in ("model.safetensors", "tokenizer.json"):
            (out / name).write_text("winner")
        return real_rename(src, dst)
    monkeypatch.setattr(models.os, "rename", another_process_first)
    assert models.ensure_target_cache(tmp_path) == out
    assert whole(out) == "winner"
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


def test_an_interrupted_conversion_leaves_nothing(tmp_path, fake_conversion):
    def interrupted():
        raise KeyboardInterrupt
    fake_conversion.append(interrupted)
    with pytest.raises(KeyboardInterrupt):
        models.ensure_target_cache(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_incomplete_cache_in_the_way_is_refused_not_deleted(tmp_path, fake_conversion):
    stale = tmp_path / models.TARGET_NAME
    stale.mkdir()
    (stale / "model.safetensors").write_text("stale")  # no tokenizer.json
    with pytest.raises(FileExistsError, match="exists but is incomplete; delete it"):
        models.ensure_target_cache(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [stale.name] and (stale / "model.safetensors").exists()


# ----------------------------------------------------------------------------- EAGLE's head cache
def test_head_cache_allocated_in_inference_mode_is_writable_outside_it():
    """`engine.decode` runs under inference mode; the same proposer stepped afterwards under no_grad writes into
    the buffers allocated there, and computes the same as inside."""
    target = tiny_model("tiny-llama", vocab_size=64, seed=1).eval()
    head = eagle.eagle_head_for(target, seed=0).eval()
    ids = torch.randint(3, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture_hidden(target, head.target_hidden) as feats:
        target(input_ids=ids)
    proposer = eagle.EagleProposer(head, graphs=False)
    with torch.inference_mode():
        proposer.observe_target(feats[0][0, :6])
        inside = proposer._catch_up(ids[:, :7])
    proposer.rollback(0)
    with torch.no_grad():
        proposer.observe_target(feats[0][0, :6])
        outside = proposer._catch_up(ids[:, :7])
    assert not proposer.cache.k.is_inference() and not proposer.cache.v.is_inference()
    for a, b in zip(inside, outside):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------- no silent clamps
def test_cropping_more_positions_than_a_cache_holds_raises():
    cache = StaticKVCache(2, 16)
    for layer in cache.layers:
        layer.length = 5
    with pytest.raises(ValueError, match=r"cannot remove 6 positions from a cache layer of 5; allowed: crop\(-n\) "
                                         r"with 0 <= n <= 5"):
        cache.crop(-6)
    with pytest.raises(ValueError, match="cannot remove 6 positions"):
        crop_cache(cache, 6)
    assert cache.length == 5
    cache.crop(9)  # the legacy meaning: keep at most 9 (transformers' DynamicLayer: a no-op)
    assert cache.length == 5
    cache.crop(-5)
    assert cache.length == 0


def test_plain_runner_commit_refuses_what_the_cache_does_not_hold():
    target = tiny_model("tiny-llama", vocab_size=64, seed=1).eval()
    ids = torch.randint(3, 64, (1, 10), generator=torch.Generator().manual_seed(0))
    nodes, parents = torch.tensor([40, 41, 42, 50]), torch.tensor([-1, 0, 0, -1])
    runner = PlainRunner(target)
    runner.begin(10)
    with torch.no_grad():
        runner.forward(ids[:, :9])
        runner.forward_tree(ids, nodes, parents, num_logits=5)
    assert runner.length == 14  # 10 tokens, then the 4 nodes
    for prefix, path, length, why in ((10, [0, 1], 13, "cut"), (10, [0, 4], 12, "nodes"), (13, [0, 1], 15, "nodes"),
                                      (10, [0, 1], -1, "cut"), (-1, [], 0, "nodes")):
        with pytest.raises(ValueError, match="allowed: 0 <= length" if why == "cut" else "each in 0.."):
            runner.commit(prefix, path, length)
        assert runner.length == 14
    runner.commit(10, [0, 2], 11)  # an EOS at the first accepted node: cut below prefix + len(path)
    assert runner.length == 11


def test_a_pooled_ratio_over_no_rounds_raises_and_a_fractional_total_is_not_clamped():
    with pytest.raises(ValueError, match=r"sum\(b\) != 0; these 2 items have sum\(b\) = 0"):
        report._pooled_ratio([(0, 0), (0, 0)])
    with pytest.raises(ValueError, match="no rounds"):
        report.ratio_interval([(0, 0), (0, 0)], resamples=10)
    assert report._pooled_ratio([(1, 0.25), (1, 0.25)]) == 4.0  # e.g. tokens per second
    # an item with no rounds among many: the ratio is defined on the sample and on every resample drawn
    assert report.ratio_interval([(0, 0)] + [(6, 2), (9, 3)] * 20, resamples=200).value == 3.0
