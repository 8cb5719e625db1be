"""Tests of the packed weights (`models.pack`, `models.unpacked`): a folder written by a real saver, packed, loads
through its normal loader bit for bit as before; a plain file beside a stale packed one wins; the unpacked copy is
built once, reused without reading the weights again, and renamed into place whole even when another process wins
the race; `python -m specdec_utils --pack` fails with one line on a bad folder."""
import hashlib
import os

import pytest
import torch
from transformers import LlamaConfig

from specdec_utils import __main__ as cli
from specdec_utils import models
from specdec_utils.core import block, eagle, medusa
from specdec_utils.models import PACKED, ReducedVocabLlamaForCausalLM, has_weights, pack, unpacked

from conftest import random_eagle_head, random_model

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private CACHE_DIR that still finds the target's tokenizer (`load_model` reads it; no weights are loaded)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / models.TARGET_NAME).symlink_to(models.ensure_target_cache())
    monkeypatch.setattr(models, "CACHE_DIR", cache)
    return cache


def tiny_draft(seed: int) -> ReducedVocabLlamaForCausalLM:
    config = LlamaConfig(vocab_size=17, full_vocab_size=49152, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(seed)
    draft = ReducedVocabLlamaForCausalLM(config).to(torch.bfloat16)
    draft.set_vocab(torch.randperm(49152, generator=torch.Generator().manual_seed(seed))[:16].sort().values)
    return draft


def bits(module) -> dict[str, bytes]:
    """Every tensor of `module`'s state as (dtype, shape, raw bytes): equal means equal bit for bit."""
    return {k: (v.dtype, tuple(v.shape), v.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes())
            for k, v in module.state_dict().items() if v is not None}


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def saved_files(folder):
    return {p.name: sha(p) for p in folder.glob("*.safetensors")}


# Each case: save a model with its real saver into a folder, and load it back with its normal loader.
def _draft(folder, monkeypatch):
    tiny_draft(seed=1).save_pretrained(folder)
    monkeypatch.setattr(models, "MODELS_DIR", folder.parent)
    return lambda: models.load_model(folder.name, device="cpu", dtype=torch.bfloat16)[0]


def _eagle(folder, monkeypatch):
    target = random_model("tiny-llama", seed=3)
    random_eagle_head(target, seed=4, vocab_ids=torch.arange(5, 200)).save(folder)
    return lambda: eagle.load_eagle(folder, target)


def _medusa(folder, monkeypatch):
    target = random_model("tiny-llama", seed=3)
    heads = medusa.MedusaHeads(target, 3)
    with torch.no_grad():
        for b in heads.blocks:
            torch.nn.init.normal_(b.weight, std=0.3)
    heads.save(folder)
    return lambda: medusa.load_heads(folder, target)


def _block(folder, monkeypatch):
    target = random_model("tiny-llama", seed=3)
    drafter = block.block_drafter_for(target, seed=5, block_size=4, vocab_ids=torch.arange(5, 200))
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(5)))
    drafter.save(folder)
    return lambda: block.load_block(folder, target)


SAVERS = {"draft-s": _draft, "eagle-head": _eagle, "medusa-heads": _medusa, "block-drafter": _block}


@pytest.mark.parametrize("name", SAVERS)
def test_a_packed_folder_loads_bit_for_bit(name, tmp_path, cache, monkeypatch):
    folder = tmp_path / "models" / name
    load = SAVERS[name](folder, monkeypatch)
    before_files, before = saved_files(folder), bits(load())
    assert before_files and unpacked(folder) == folder  # nothing packed: the folder itself
    packed = pack(folder)
    assert sorted(p.name for p in packed) == sorted(n + PACKED for n in before_files)
    assert not list(folder.glob("*.safetensors")) and all(p.is_file() for p in packed)
    assert all(has_weights(folder, n) for n in before_files)
    after = bits(load())
    assert after.keys() == before.keys()
    for k in before:
        assert after[k] == before[k], f"{name}: {k} differs after packing"
    copy = unpacked(folder)
    assert copy.parent == cache / "unpacked" and copy.name.startswith(name + "-")
    assert saved_files(copy) == before_files  # the same bytes as the saver wrote
    assert {p.name for p in copy.iterdir()} == {p.name.removesuffix(PACKED) for p in folder.iterdir()}


def test_the_shipped_ngram_table_loads_the_same_packed(tmp_path, cache, monkeypatch):
    """The n-gram table (models imports ngram, so load_model unpacks it): load_model('ngram') from a packed copy."""
    from specdec_utils.core.ngram import NgramDraft
    table = NgramDraft.build([([5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 9], 0)], vocab_size=20, min_count=1)
    folder = tmp_path / "models" / models.NGRAM_NAME
    table.save(folder)
    pack(folder)
    with pytest.raises(FileNotFoundError, match="is packed: load it with"):
        NgramDraft.load(folder)
    monkeypatch.setattr(models, "MODELS_DIR", folder.parent)
    loaded, _ = models.load_model(models.NGRAM_NAME)
    assert loaded.tables == table.tables and loaded.vocab_size == 20


def test_a_plain_file_beside_a_stale_packed_one_wins(tmp_path, cache, monkeypatch):
    folder = tmp_path / "models" / "draft-s"
    load = _draft(folder, monkeypatch)
    pack(folder)
    retrained = tiny_draft(seed=2)
    retrained.save_pretrained(folder)  # a learner retrains in place: the trainers write uncompressed files
    assert (folder / ("model.safetensors" + PACKED)).exists() and unpacked(folder) == folder
    assert bits(load()) == bits(retrained)
    assert not (cache / "unpacked").exists() or not list((cache / "unpacked").iterdir())


def test_the_unpacked_copy_is_built_once_and_reused(tmp_path, cache, monkeypatch):
    folder = tmp_path / "m"
    _eagle(folder, monkeypatch)
    pack(folder)
    first = unpacked(folder)
    stamps = {p.name: p.stat().st_mtime_ns for p in [first, *first.iterdir()]}

    def no_reading(*args, **kwargs):
        raise AssertionError("the weights were decompressed again")
    with monkeypatch.context() as patch:
        patch.setattr(models.lzma, "open", no_reading)
        models._digests.clear()  # as in a new process: the digest is computed again, the copy still reused
        assert unpacked(folder) == first
    assert {p.name: p.stat().st_mtime_ns for p in [first, *first.iterdir()]} == stamps
    # a changed packed file gets a copy of its own (the digest is in the name)
    target = random_model("tiny-llama", seed=3)
    random_eagle_head(target, seed=9, vocab_ids=torch.arange(5, 200)).save(folder)
    pack(folder)
    assert unpacked(folder) != first and sha(unpacked(folder) / "head.safetensors") != sha(first / "head.safetensors")
    # so does an edited small file beside the weights (a config), which the copy holds too
    second = unpacked(folder)
    (folder / "config.json").write_text((folder / "config.json").read_text().replace("{", '{"edited": 1, ', 1))
    assert unpacked(folder) != second and '"edited": 1' in (unpacked(folder) / "config.json").read_text()


def test_unpacking_twice_and_losing_the_race(tmp_path, cache, monkeypatch):
    """Two calls with the copy removed in between both build it; a call whose rename loses the race to another
    process (the copy appeared meanwhile) drops its own temporary folder and returns the winner's."""
    import shutil
    folder = tmp_path / "m"
    _medusa(folder, monkeypatch)
    original = {n: sha(folder / n) for n in ("heads.safetensors",)}
    pack(folder)
    first = unpacked(folder)
    shutil.rmtree(first)
    second = unpacked(folder)
    assert second == first and sha(second / "heads.safetensors") == original["heads.safetensors"]
    winner = tmp_path / "winner"
    shutil.copytree(second, winner)
    shutil.rmtree(second)
    real_rename = os.rename

    def another_process_first(src, dst):  # the other process's copy lands just before ours
        shutil.copytree(winner, dst)
        return real_rename(src, dst)
    with monkeypatch.context() as patch:
        patch.setattr(models.os, "rename", another_process_first)
        assert unpacked(folder) == first
    assert sha(first / "heads.safetensors") == original["heads.safetensors"]
    assert sorted(p.name for p in (cache / "unpacked").iterdir()) == [first.name]  # no temporary folder left


def test_packed_weights_count_as_present_and_missing_ones_say_so(tmp_path):
    folder = tmp_path / "h"
    folder.mkdir()
    assert not has_weights(folder, "head.safetensors")
    (folder / ("head.safetensors" + PACKED)).write_bytes(b"")
    assert has_weights(folder, "head.safetensors") and unpacked(tmp_path / "missing") == tmp_path / "missing"


def test_the_pack_command(tmp_path, capsys):
    assert cli.main(["--pack", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    (tmp_path / "empty").mkdir()
    assert cli.main(["--pack", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "no .safetensors file in" in err and err.strip().count("\n") == 0
    tiny_draft(seed=1).save_pretrained(tmp_path / "d")
    assert cli.main(["--pack", str(tmp_path / "d")]) == 0
    assert "packed:" in capsys.readouterr().out and (tmp_path / "d" / ("model.safetensors" + PACKED)).exists()


def test_weights_facts_name_the_weights_packed_or_not(tmp_path, cache, monkeypatch):
    """`weights_facts`, what a committed run records about a model: the hash of its weight file's bytes, the same
    packed as plain; another training's weights under the same name, another hash; a folder named by its own name
    (no path of this machine); a name with no folder here, the name alone."""
    folder = tmp_path / "models" / "draft-m"
    _draft(folder, monkeypatch)
    plain = models.weights_facts("draft-m")
    assert plain == {"from": "draft-m", "weights_sha256": sha(folder / "model.safetensors")[:16]}
    pack(folder)
    assert not (folder / "model.safetensors").exists() and models.weights_facts("draft-m") == plain
    assert models.weights_facts(str(folder)) == {**plain, "from": "draft-m"}
    tiny_draft(seed=2).save_pretrained(folder)  # retrained in place: the name stays, the hash does not
    assert models.weights_facts("draft-m")["weights_sha256"] != plain["weights_sha256"]
    hub = "HuggingFaceTB/SmolLM2-360M-Instruct"
    assert models.weights_facts(hub) == {"from": hub}
