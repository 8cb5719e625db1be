"""Data-parallel training (specdec_lab/distributed.py) and training in sittings (the trainers' checkpoints), on the CPU:
two copies over gloo train exactly as one process on the global batch (the EAGLE trainer and the draft trainer), and
a run stopped and resumed from its checkpoint ends with the weights of a run that never stopped (both trainers)."""
import pytest
import torch
import torch.multiprocessing as mp

from specdec_lab import distributed, train_eagle

from conftest import random_model

RECIPE = train_eagle.VARIANTS["ttt"]  # the full vocabulary and no noise: both ways of training see the same numbers


class Rows:
    """A corpus of equal-length rows (no padding, so a batch's mean loss is the mean of its two halves' means)."""

    def __init__(self, n: int = 16, length: int = 12):
        self.ids = torch.randint(3, 64, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def batch(self, indices, max_len, device):
        ids = self.ids[list(indices)].to(device)
        return ids, torch.ones_like(ids)


def trained(batch_size: int, steps: int = 3, **options) -> dict:
    target = random_model("tiny-llama", seed=0, vocab=64)
    for p in target.parameters():
        p.requires_grad_(False)
    torch.manual_seed(0)
    head = train_eagle.build_head(target, RECIPE, None)
    train_eagle.train(head, target, Rows(), RECIPE, steps, batch_size, 1e-2, 12, verbose=False, **options)
    return {k: v.detach().clone() for k, v in head.state_dict().items() if not k.startswith("target")}


def _copy(rank: int, rendezvous: str, out: str, train=None) -> None:
    """One of two copies over gloo: trains with `train` (default `trained`) on batch 2; the first saves the state."""
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    assert distributed.world_size() == 2 and distributed.is_main() == (rank == 0)
    state = (train or trained)(2)
    if rank == 0:
        torch.save(state, out)
    distributed.finish()


def test_two_copies_train_as_one_process_on_the_global_batch(tmp_path):
    mp.spawn(_copy, args=(str(tmp_path / "rendezvous"), str(tmp_path / "two.pt")), nprocs=2, join=True)
    two, one = torch.load(tmp_path / "two.pt"), trained(4)
    assert one.keys() == two.keys() and len(one) > 3
    before = trained(4, steps=0)
    assert any(not torch.equal(one[k], before[k]) for k in one)  # it trained
    for k in one:
        assert torch.allclose(one[k], two[k], atol=1e-5), k


def draft_trained(batch_size: int, steps: int = 3, **options) -> dict:
    """A tiny reduced-vocabulary draft distilled by train_draft.train (the acceptance objective mixed in) from
    equal-length rows."""
    from test_train_draft import tiny_draft

    from specdec_lab import train_draft
    target = random_model("tiny-llama", seed=0, vocab=64)
    for p in target.parameters():
        p.requires_grad_(False)
    draft = tiny_draft(torch.arange(0, 64, 2))
    corpus = [{"ids": row.tolist(), "prompt_len": 2} for row in Rows().ids]
    train_draft.train(draft, target, corpus, steps, batch_size, 3e-3, objective="kl+lk", **options)
    return {k: v.detach().clone() for k, v in draft.state_dict().items()}


@pytest.mark.parametrize("train", [trained, draft_trained], ids=["eagle-head", "draft"])
def test_a_run_resumed_from_its_checkpoint_ends_as_one_that_never_stopped(tmp_path, train):
    checkpoint = tmp_path / "state.pt"
    straight = train(4, steps=5)
    train(4, steps=5, checkpoint=checkpoint, checkpoint_every=1, until=2)  # the first sitting: steps 0 and 1
    assert torch.load(checkpoint, weights_only=False)["step"] == 2
    resumed = train(4, steps=5, checkpoint=checkpoint, checkpoint_every=1)  # a fresh model, resumed
    assert torch.load(checkpoint, weights_only=False)["step"] == 5
    assert any(not torch.equal(straight[k], train(4, steps=2)[k]) for k in straight)  # the last steps matter
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_two_copies_distil_a_draft_as_one_process_on_the_global_batch(tmp_path):
    mp.spawn(_copy, args=(str(tmp_path / "rendezvous"), str(tmp_path / "two.pt"), draft_trained), nprocs=2, join=True)
    two, one, before = torch.load(tmp_path / "two.pt"), draft_trained(4), draft_trained(4, steps=0)
    assert one.keys() == two.keys() and any(not torch.equal(one[k], before[k]) for k in one)
    for k in one:
        assert torch.allclose(one[k], two[k], atol=1e-5), k


def _corpus_copy(rank: int, rendezvous: str, out: str) -> None:
    from specdec_lab import write_corpus
    torch.set_num_threads(1)
    write_corpus.QUESTION_TOKENS = 8  # a random model seldom ends its question anyway
    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    assert write_corpus.main(["--target", "tiny-llama", "--device", "cpu", "--tokens", "60", "--batch", "4",
                              "--new-tokens", "8", "--out", out]) == 0


def test_two_copies_write_one_corpus_each_its_share_from_its_own_seed(tmp_path, monkeypatch):
    import json

    from specdec_lab import write_corpus
    out = tmp_path / "corpus.pt"
    mp.spawn(_corpus_copy, args=(str(tmp_path / "rendezvous"), str(out)), nprocs=2, join=True)
    joined, log = write_corpus.load_corpus(out), json.loads(out.with_suffix(".json").read_text())
    assert log["copies"] == 2 and log["seed"] == [0, write_corpus.COPY_SEED_STRIDE] and log["rows"] == len(joined)
    assert not list(tmp_path.glob("corpus.part*"))  # the parts are joined and gone
    monkeypatch.setattr(write_corpus, "QUESTION_TOKENS", 8)
    alone = tmp_path / "alone.pt"  # the first copy's share, written by one process from the same seed
    assert write_corpus.main(["--target", "tiny-llama", "--device", "cpu", "--tokens", "30", "--batch", "4",
                              "--new-tokens", "8", "--out", str(alone)]) == 0
    first = write_corpus.load_corpus(alone)
    assert [r["ids"] for r in list(joined)[:len(first)]] == [r["ids"] for r in first]
    assert len(joined) > len(first) and log["continuation_tokens"] >= 60
