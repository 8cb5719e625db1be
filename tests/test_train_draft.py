"""Tests of the distillation code on tiny models: the loss is a real KL in the draft's reduced
vocabulary, training lowers it, the simulated tau follows greedy speculative decoding, and the CLI
refuses bad arguments with one clear line."""
import pytest
import torch
from transformers import LlamaConfig

from specdec_utils.tools import train_draft
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


@pytest.mark.parametrize("matches, gamma, expected", [
    ([True] * 8, 4, [5, 4]),                  # 4 accepted + bonus, then 3 left: all accepted + end
    ([False] * 3, 4, [1, 1, 1]),              # every round: only the target's own token
    ([True, False, True, True, True, True, False], 2, [2, 3, 2]),
])
def test_greedy_block_lengths(matches, gamma, expected):
    blocks = train_draft.greedy_block_lengths(matches, gamma)
    assert blocks == expected and sum(blocks) >= len(matches)


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
    kl, agree = train_draft.distill_loss(draft, target, ids, mask)
    assert kl.item() > 0 and 0 <= agree.item() <= 1
    corpus = [{"ids": row.tolist(), "prompt_len": 2} for row in ids]
    log = train_draft.train(draft, target, corpus, steps=60, batch_size=4, lr=3e-3, log_every=10)
    assert log[-1]["kl"] < 0.7 * log[0]["kl"]
    assert log[-1]["step"] == 59 and all(e["lr"] > 0 for e in log)


@pytest.mark.parametrize("args, message", [(["--names", "draft-xl"], "unknown draft 'draft-xl'"),
                                           (["--steps", "0"], "--steps must be >= 1"),
                                           (["--corpus-only"], "--corpus-only needs --corpus")])
def test_cli_rejects_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_draft.parse_args(args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
