"""Tests of the distillation code on tiny models: the loss is a real KL in the draft's reduced
vocabulary, training lowers it, and the CLI refuses bad arguments with one clear line. (The simulated tau,
`theory.simulate_rounds`, is checked against the engine in test_theory.py.)"""
import math

import pytest
import torch
from transformers import LlamaConfig

from specdec_lab import train_draft
from specdec_utils import training
from specdec_utils.models import ReducedVocabLlamaForCausalLM, tiny_model

V = 64


pytestmark = pytest.mark.usefixtures("single_thread")


def tiny_draft(vocab_ids):
    config = LlamaConfig(vocab_size=len(vocab_ids) + 1, full_vocab_size=V, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    draft = ReducedVocabLlamaForCausalLM(config)
    draft.set_vocab(vocab_ids)
    return draft


def test_choose_vocab_takes_the_most_frequent_tokens():
    corpus = [{"ids": [5, 5, 5, 7, 7, 9], "prompt_len": 0}, {"ids": [9, 5, 3], "prompt_len": 2}]
    assert train_draft.choose_vocab(corpus, 2, V).tolist() == [5, 7]
    # continuation tokens (what the draft must predict) count double against prompt tokens
    assert train_draft.choose_vocab([{"ids": [7, 7, 7, 9, 9], "prompt_len": 3}], 1, V).tolist() == [9]


def test_distill_loss_is_kl_and_training_lowers_it():
    target = tiny_model("tiny-llama", vocab_size=V, seed=1).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    draft = tiny_draft(torch.arange(0, V, 2))  # half the vocabulary
    ids = torch.randint(0, V, (4, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    kl, agree, kl_again, alpha = train_draft.distill_loss(draft, target, ids, mask)
    assert kl.item() > 0 and 0 <= agree.item() <= 1 and kl_again.item() == kl.item() and 0 < alpha.item() < 1
    corpus = [{"ids": row.tolist(), "prompt_len": 2} for row in ids]
    log = train_draft.train(draft, target, corpus, steps=60, batch_size=4, lr=3e-3, log_every=10)
    assert log[-1]["kl"] < 0.7 * log[0]["kl"]
    assert log[-1]["step"] == 59 and all(e["lr"] > 0 for e in log)


def test_batch_pads_and_cuts_corpus_rows():
    corpus = [{"ids": [5, 6, 7, 8]}, {"ids": [9]}, {"ids": [1, 2]}]
    ids, mask = training.batch(corpus, [0, 1], 3, "cpu")
    assert ids.tolist() == [[5, 6, 7], [9, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    ids, mask = training.batch(corpus, [2, 0], None, "cpu")  # None: whole rows
    assert ids.tolist() == [[1, 2, 0, 0], [5, 6, 7, 8]] and mask.sum().item() == 6


@pytest.mark.parametrize("peak, warmup, total, floor", [(2e-3, 400, 20000, 2e-4), (3e-4, 500, 3000, 1e-5),
                                                         (1e-3, 30, 45, 0.0)])
def test_lr_schedule_is_the_library_schedule(peak, warmup, total, floor):
    """Both trainers' rate is transformers' warm-up + cosine with a floor, stepped as a LambdaLR would; after
    the last step it stays at the floor (the library's cosine would climb again)."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup_lr_rate

    from specdec_utils.core.medusa import lr_at
    rate = training.lr_schedule(peak, warmup, total, floor)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)
    library = get_cosine_with_min_lr_schedule_with_warmup_lr_rate(optimizer, warmup, total, min_lr=floor)
    for step in range(total):
        assert rate(step) == pytest.approx(library.get_last_lr()[0], rel=1e-12, abs=1e-15)
        optimizer.step()
        library.step()
    assert rate(0) == pytest.approx(peak / warmup) and rate(warmup - 1) == pytest.approx(peak)
    assert rate(total - 1) == pytest.approx(floor, abs=1e-15) == rate(10 * total)
    assert lr_at(7, total, peak, warmup, floor) == rate(7)  # the heads' schedule is the same function


def test_stop_head_training_pipeline_on_tiny_models():
    """specdec_lab/train_stop_head: features and exact acceptance labels along target-written rows, then a fit."""
    from specdec_lab import train_stop_head
    from specdec_utils.core.stop_head import StopHead
    target, draft = (tiny_model("tiny-llama", vocab_size=V, seed=seed).eval() for seed in (1, 2))
    rows = torch.randint(3, V, (6, 10), generator=torch.Generator().manual_seed(0))
    corpus = [{"ids": row[:7 + i % 3].tolist(), "prompt_len": 4} for i, row in enumerate(rows)]
    features, labels = train_stop_head.collect(target, draft, corpus, batch_size=4)
    positions = sum(len(r["ids"]) - r["prompt_len"] for r in corpus)
    assert features.shape == (positions, draft.config.hidden_size + 3) and labels.shape == (positions, 2)
    assert set(labels[:, 0].tolist()) <= {0.0, 1.0} and 0 <= labels[:, 1].min() <= labels[:, 1].max() <= 1
    head, log = train_stop_head.train_head(features, labels, steps=20, seed=0, val_fraction=0.3)
    assert isinstance(head, StopHead) and set(log["val_auc"]) == {"greedy", "sampled"}


def test_roc_auc_counts_ties_half():
    """scikit-learn's AUC is the probability that a positive outscores a negative, ties counting half."""
    from specdec_utils.core.stop_head import roc_auc
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (200,), generator=generator).float()  # many ties
    positive = torch.rand(200, generator=generator) < scores / 5
    pos, neg = scores[positive], scores[~positive]
    pairwise = ((pos[:, None] > neg[None]).double().mean() + 0.5 * (pos[:, None] == neg[None]).double().mean()).item()
    assert roc_auc(scores, positive) == pytest.approx(pairwise, rel=1e-12)
    assert roc_auc(torch.tensor([0.1, 0.9]), torch.tensor([False, True])) == 1.0
    assert math.isnan(roc_auc(scores, torch.ones(200, dtype=torch.bool)))  # one kind only


@pytest.mark.parametrize("args, message", [(["--names", "draft-xl"], "unknown draft 'draft-xl'"),
                                           (["--steps", "0"], "--steps must be >= 1"),
                                           (["--corpus-only"], "--corpus-only needs --corpus"),
                                           (["--names", "draft-s,draft-m", "--init", "."], "--init: one draft name"),
                                           (["--names", "draft-s", "--init", "nowhere"], "--init: one draft name")])
def test_cli_rejects_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_draft.parse_args(args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_cli_goes_on_training_a_saved_draft(tmp_path):
    import json

    from specdec_lab import write_corpus
    corpus = tmp_path / "corpus.pt"
    assert write_corpus.main(["--target", "tiny-llama", "--device", "cpu", "--tokens", "60", "--batch", "4",
                              "--new-tokens", "12", "--out", str(corpus), "--mix", "docs=1"]) == 0
    common = ["--names", "draft-s", "--target", "tiny-llama", "--device", "cpu", "--corpus", str(corpus),
              "--batch-size", "2", "--eval-prompts", "2", "--vocab-size", "64"]
    assert train_draft.main([*common, "--steps", "2", "--out", str(tmp_path / "a")]) == 0
    assert train_draft.main([*common, "--steps", "1", "--out", str(tmp_path / "b"),
                             "--init", str(tmp_path / "a" / "draft-s")]) == 0
    a = ReducedVocabLlamaForCausalLM.from_pretrained(tmp_path / "a" / "draft-s")
    b = ReducedVocabLlamaForCausalLM.from_pretrained(tmp_path / "b" / "draft-s")
    assert torch.equal(a.draft_to_full, b.draft_to_full)
    assert not torch.equal(a.model.layers[0].mlp.up_proj.weight, b.model.layers[0].mlp.up_proj.weight)
    log = json.loads((tmp_path / "b" / "draft-s" / "training_log.json").read_text())
    low, high = log["eval"]["tau_interval"]  # bootstrapped over the prompts, in float32 as the lessons measure
    assert 1 <= low <= log["eval"]["tau"] <= high and log["eval"]["dtype"] == "float32"
    rounds = log["eval"]["tau_per_prompt"]  # (tokens, rounds) per prompt: tau pools them (`report.ratio_interval`)
    assert log["eval"]["tau"] == sum(t for t, _ in rounds) / sum(n for _, n in rounds)
    assert log["continued_from"]["eval"] == json.loads(
        (tmp_path / "a" / "draft-s" / "training_log.json").read_text())["eval"]
    with pytest.raises(SystemExit, match="is not draft-m's"):
        train_draft.main([*common[:1], "draft-m", *common[2:], "--steps", "1", "--out", str(tmp_path / "c"),
                          "--init", str(tmp_path / "a" / "draft-s")])


def test_the_acceptance_objective_raises_the_acceptance_rate():
    """Trained on -log sum min(p, q) (objectives.py, `lk`), the draft's logged acceptance rate rises, and the log
    keeps the KL beside it."""
    target = tiny_model("tiny-llama", vocab_size=V, seed=1).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    draft = tiny_draft(torch.arange(0, V, 2))
    ids = torch.randint(0, V, (4, 12), generator=torch.Generator().manual_seed(0))
    corpus = [{"ids": row.tolist(), "prompt_len": 2} for row in ids]
    log = train_draft.train(draft, target, corpus, steps=60, batch_size=4, lr=3e-3, log_every=10, objective="lk")
    assert log[-1]["acceptance"] > log[0]["acceptance"] + 0.05
    assert log[-1]["loss"] >= -math.log(log[-1]["acceptance"]) - 1e-6  # the mean of -log alpha, by Jensen
    assert all(e["kl"] > 0 for e in log)


def test_frozen_target_picks_its_dtype_for_the_device_load_model_picks(monkeypatch):
    """Without --device the target lands where load_model puts it (cuda first): bfloat16 there, as under torchrun.
    (A one-GPU run once trained against a float32 target beside a two-GPU run in bfloat16: its scaling was void.)"""
    import argparse

    import torch

    from specdec_lab import train_draft

    seen = {}

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

    def fake_load(name, device=None, dtype=None):
        seen.update(device=device, dtype=dtype)
        return Tiny(), None

    monkeypatch.setattr(train_draft, "load_model", fake_load)
    monkeypatch.setattr(train_draft, "get_device", lambda: torch.device("cuda"))
    args = argparse.Namespace(device=None, dtype="auto", target="smollm2-135m")
    assert train_draft.frozen_target(args)[2] == torch.bfloat16 and seen["device"].type == "cuda"
    monkeypatch.setattr(train_draft, "get_device", lambda: torch.device("cpu"))
    assert train_draft.frozen_target(args)[2] == torch.float32


def test_in_float32_measures_in_float32_and_leaves_the_float32_buffers_alone():
    """Inside: every parameter float32, the trained module's values rounded to bf16 first (as saved). After: the
    dtypes back, and the target's rotary frequencies (a float32 buffer in a bf16 model) never rounded."""
    from specdec_utils.models import tiny_model
    target = tiny_model("tiny-llama", vocab_size=64)
    for p in target.parameters():  # bf16 weights beside float32 buffers, as from_pretrained(dtype=bf16) loads them
        p.data = p.data.to(torch.bfloat16)
    draft = tiny_model("tiny-llama", vocab_size=64, seed=1)  # float32, as trained
    freq = target.model.rotary_emb.inv_freq
    assert freq.dtype == torch.float32
    before = freq.clone()
    exact = draft.model.norm.weight.data.clone().add_(1e-3)  # not representable in bf16
    draft.model.norm.weight.data.copy_(exact)
    with train_draft.in_float32(target, draft):
        assert {p.dtype for p in target.parameters()} == {p.dtype for p in draft.parameters()} == {torch.float32}
        assert torch.equal(draft.model.norm.weight, exact.to(torch.bfloat16).float())
    assert {p.dtype for p in target.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in draft.parameters()} == {torch.float32}
    after = target.model.rotary_emb.inv_freq
    assert after.dtype == torch.float32 and torch.equal(after, before)
