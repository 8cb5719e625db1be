"""The exercise solutions in notebooks/solutions/ are code a learner compares against: they must work."""
import importlib.util
from pathlib import Path

import pytest
import torch

from specdec_utils import generate
from specdec_utils.engine import RoundStats
from specdec_utils.theory import expected_tokens_per_round
from conftest import noisy_copy, random_model, random_prompt

SOLUTIONS = Path(__file__).resolve().parent.parent / "notebooks" / "solutions"

pytestmark = pytest.mark.usefixtures("single_thread")


def load(name):
    spec = importlib.util.spec_from_file_location(name, SOLUTIONS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ch03():
    return load("ch03")


def stats(drafted, accepted):
    return RoundStats(drafted, drafted, accepted, "gamma", drafted, accepted + 1, 0.0, 0.0, 0.0)


def test_ch03_multiplicative_policy(ch03):
    policy = ch03.MultiplicativeGamma(4)
    trace = []
    for drafted, accepted in [(4, 4), (8, 8), (16, 16), (16, 3), (8, 0), (4, 1), (2, 2)]:
        assert policy.round_gamma() == drafted
        policy.observe(stats(drafted, accepted))
        trace.append(policy.gamma)
    assert trace == [8, 16, 16, 8, 4, 2, 4]
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.01, seed=1)
    input_ids = random_prompt(5, 0)
    result = generate(target, input_ids, 30, method=ch03.MultiplicativeGamma(4), draft=draft)
    assert result.new_token_ids == generate(target, input_ids, 30, method="ar").new_token_ids


def test_ch03_best_fixed_gamma_is_the_argmax_of_the_model(ch03):
    t_verify = {k: 10.0 + 0.5 * (k - 1) for k in range(1, 10)}
    assert ch03.best_fixed_gamma([0.05] * 8, 1.0, t_verify) == 1
    assert ch03.best_fixed_gamma([0.95] * 8, 0.2, t_verify) == 8
    rising = [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.9, 0.9]
    best = ch03.best_fixed_gamma(rising, 1.0, t_verify)
    speed = {g: expected_tokens_per_round(rising, g) * 10 / (g + t_verify[g + 1]) for g in range(1, 9)}
    assert best == max(speed, key=speed.get)


def test_ch03_only_drafting_the_rejected_token_keeps_sampling_exact(ch03):
    generator = torch.Generator().manual_seed(0)
    for _ in range(10):
        p = torch.rand(7, generator=generator).softmax(0)
        q = (3 * torch.rand(7, generator=generator)).softmax(0)
        stop_before, draft_it = ch03.oracle_emissions(p, q)
        torch.testing.assert_close(draft_it, p.double())
        assert 0.5 * (stop_before - p.double()).abs().sum() > 1e-3
        torch.testing.assert_close(stop_before.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_ch03_best_gamma_per_category(ch03):
    easy = [stats(8, 8)] * 10 + [stats(8, 6)] * 5
    hard = [stats(8, 0)] * 12 + [stats(8, 1)] * 3
    t_verify = {k: 10.0 + 0.2 * (k - 1) for k in range(1, 10)}
    best = ch03.best_gamma_per_category({"code": easy, "stories": hard}, 1.0, t_verify)
    assert best["code"] == 8 and best["stories"] == 1


@pytest.fixture(scope="module")
def ch04():
    return load("ch04")


def test_ch04_entropy_stop_before_drops_the_unsure_token(ch04):
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.01, seed=1)
    input_ids = random_prompt(5, 0)
    before = generate(target, input_ids, 30, method=ch04.EntropyStopBefore(tau0=5.0), draft=draft)
    assert before.new_token_ids == generate(target, input_ids, 30, method="ar").new_token_ids
    assert any(r.stop == "entropy" for r in before.rounds)
    assert before.draft_calls > before.drafted  # a stopped-before round paid for the pass that told it to stop


def test_ch04_roc_thresholds(ch04):
    probs = [0.9, 0.8, 0.75, 0.6, 0.5, 0.45, 0.4, 0.3, 0.2, 0.1, 0.05]
    accepted = [1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0]
    chosen = ch04.roc_thresholds(probs, accepted)
    assert chosen[1.0] == 0.6 and chosen[3.0] == 0.4 and chosen[10.0] == 0.4
    assert chosen[1.0] >= chosen[3.0] >= chosen[10.0]  # dearer false negatives -> a lower threshold


def test_ch04_peeking_emission_is_biased(ch04):
    p = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.10, 0.08, 0.05, 0.02])
    q = torch.tensor([0.10, 0.35, 0.25, 0.05, 0.10, 0.05, 0.10, 0.00])
    emitted, tv = ch04.peeking_emission(p, q)
    torch.testing.assert_close(emitted.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert tv > 0.05
    _, same = ch04.peeking_emission(p, p)
    assert same == pytest.approx(0.0)


def test_ch04_cost_aware_stop_is_lossless_and_stops(ch04):
    from specdec_utils.stop_head import StopHead
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.01, seed=1)
    torch.manual_seed(0)
    head = StopHead(draft.get_output_embeddings().in_features)
    t_verify = {k: 10.0 + 3.0 * (k - 1) for k in range(1, 12)}
    input_ids = random_prompt(6, 1)
    result = generate(target, input_ids, 30, method=ch04.CostAwareStop(head, 1.0, t_verify, token_ms=8.0), draft=draft)
    assert result.new_token_ids == generate(target, input_ids, 30, method="ar").new_token_ids
    assert any(r.stop == "cost" for r in result.rounds)


@pytest.fixture(scope="module")
def ch05():
    return load("ch05")


def test_ch05_tau2_sweep_variants_run_losslessly(ch05):
    from specdec_utils import bench
    variants = ch05.tau2_sweep((0.5, 2.0))
    assert [v.params.get("tau2") for v in variants] == [0.5, 2.0, None, None]
    assert all(v.draft_small == "ngram" for v in variants[:3]) and variants[-1].method == "entropy-stop"
    target = random_model("tiny-llama", seed=0)
    middle = noisy_copy(target, noise=0.01, seed=1)
    from specdec_utils.ngram import NgramDraft
    table = NgramDraft({3: {}, 2: {}}, vocab_size=target.config.vocab_size)
    input_ids = random_prompt(6, 2)
    for variant in variants[:3]:
        result = generate(target, input_ids, 20, method=variant.method, draft=middle, draft_small=table,
                          params=variant.params)
        assert result.new_token_ids == generate(target, input_ids, 20, method="ar").new_token_ids
    assert isinstance(variants[0], bench.Variant)


def test_ch05_kept_tokens_are_biased_unless_the_drafts_agree(ch05):
    p = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.10, 0.08, 0.05, 0.02])
    q = torch.tensor([0.10, 0.35, 0.25, 0.05, 0.10, 0.05, 0.10, 0.00])
    kept, tv = ch05.kept_token_distribution(p, q)
    torch.testing.assert_close(kept.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert tv > 0.05 and kept[-1] == 0  # a token M1 never proposes is never kept
    assert ch05.kept_token_distribution(p, p)[1] == pytest.approx(0.0)


def test_ch05_min_agreement_for_gain(ch05):
    a12 = ch05.min_agreement_for_gain(0.1, 0.3, 0.8)
    assert a12 is not None and 0.3 < a12 < 0.95
    assert ch05.min_agreement_for_gain(0.1, 0.3, 0.8, gain=1.2) > a12  # a bigger gain needs more agreement
    assert ch05.min_agreement_for_gain(0.25, 0.053, 0.624) > ch05.min_agreement_for_gain(0.25, 0.3, 0.8)
    assert ch05.min_agreement_for_gain(0.5, 0.02, 0.75) is None  # a cheap M2 leaves nothing to gain


def test_ch05_context_only_ignores_the_table(ch05):
    from specdec_utils.ngram import NgramDraft
    table = NgramDraft.build([([5, 6, 7, 8, 5, 6, 7, 9], 0)], vocab_size=20, min_count=1)
    assert table.lookup([0, 5, 6, 7]) is not None
    lookup_only = ch05.context_only(table)
    assert lookup_only.lookup([0, 5, 6, 7]) is None
    assert lookup_only.lookup([5, 6, 7, 1, 5, 6, 7]) == ([1], [1])


@pytest.fixture(scope="module")
def ch06():
    return load("ch06")


def test_ch06_sparse_tree_by_scan_matches_the_heap(ch06):
    from specdec_utils import tree as trees
    acc = [[0.5, 0.2], [0.3, 0.1]]
    assert ch06.sparse_paths_by_scan(acc, 4) == [(0,), (1,), (0, 0), (1, 0)]
    assert trees.expected_accept_length(ch06.sparse_paths_by_scan(acc, 4), acc) == pytest.approx(1.91)
    rng = torch.Generator().manual_seed(0)
    acc = (torch.rand(4, 6, generator=rng) * 0.3).tolist()
    for budget in (1, 5, 20, 40):
        mine, theirs = ch06.sparse_paths_by_scan(acc, budget), trees.sparse_paths(acc, budget)
        assert trees.expected_accept_length(mine, acc) == pytest.approx(trees.expected_accept_length(theirs, acc))


def test_ch06_one_hot_and_drawn_children_both_emit_p(ch06):
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.6, 0.2])
    (one_hot_accept, one_hot_out), (drawn_accept, drawn_out) = ch06.compare_one_hot_and_drawn(p, q)
    torch.testing.assert_close(one_hot_out, p.double())
    torch.testing.assert_close(drawn_out, p.double())
    assert one_hot_accept == pytest.approx(0.8)  # q's top-2 are tokens 1 and 0: p(1) + p(0)
    assert 0 < drawn_accept < 1 and drawn_accept != pytest.approx(one_hot_accept)


def test_ch06_head_gap(ch06):
    log = [{"step": 0, "heldout": {"top1": [0.1, 0.05]}}, {"step": 9}, {"step": 10, "heldout": {"top1": [0.3, 0.1]}}]
    assert ch06.head_gap(log) == pytest.approx(0.2)


def test_ch07_ancestors_by_lifting_and_bytes():
    import random
    from specdec_utils.tree import tree_mask
    ch07 = load("ch07")
    rng = random.Random(0)
    chain = torch.arange(256) - 1
    mask, steps = ch07.ancestor_mask_by_lifting(chain)
    assert torch.equal(mask, tree_mask(chain)) and steps <= 10
    for T in (1, 2, 9, 70, 256):
        parents = torch.tensor([-1] + [rng.randrange(max(-1, i - 8), i) for i in range(1, T)])
        mask, steps = ch07.ancestor_mask_by_lifting(parents)
        assert torch.equal(mask, tree_mask(parents)), T
    star = torch.full((5,), -1)
    assert torch.equal(ch07.ancestor_mask_by_lifting(star)[0], torch.eye(5, dtype=torch.bool))
    # P = 1024, T = 64, head_dim 64, bf16, 9 query heads on 3 KV heads
    first, packed, per_head = (ch07.kv_bytes(1024, 64, 64, 2, h, blocks) for h, blocks in ((9, 4), (3, 4), (9, 1)))
    assert first == 2 * 9 * 4 * 1088 * 64 * 2 and first == 3 * packed and per_head * 4 == first
    assert ch07.mask_bytes(1024, 64) == 64 * 1088


def test_ch08_bound_and_buffer_bytes():
    import json
    ch08 = load("ch08")
    assert ch08.expected_tau(0.0, 4) == 1 and ch08.expected_tau(1.0, 4) == 5
    assert abs(ch08.expected_tau(0.5, 2) - 1.75) < 1e-12
    rows = [(g, ch08.expected_tau(0.7, g)) for g in (2, 4, 6)]
    assert ch08.fit_alpha(rows) == 0.7
    assert abs(ch08.predicted_tok_per_s(0.5, 2, 4.0, 0.5, 1.0) - 1.75 / 6.0 * 1e3) < 1e-9
    bench = json.loads(ch08.BENCH.read_text())
    compared = ch08.compare(bench)
    assert [g for g, _, _ in compared] == [2, 3, 4, 5, 6]
    assert all(0.7 < predicted / measured < 1.3 for _, measured, predicted in compared)
    assert ch08.kv_bytes_per_step(1024, 30, 3, 64, 2) == 2 * 30 * 3 * 1024 * 64 * 2 == 4 * ch08.kv_bytes_per_step(256, 30, 3, 64, 2)


def test_ch09_bootstrap_and_loop_overhead():
    ch09 = load("ch09")

    def rec(method, prompt, tokens, wall, calls):
        return {"id": prompt, "method": method, "category": "code", "new_tokens": tokens, "wall_s": wall,
                "target_calls": calls}
    records = [rec("ar", "a", 10, 1.0, 10), rec("ar", "b", 10, 1.0, 10),
               rec("greedy", "a", 10, 0.5, 4), rec("greedy", "b", 10, 0.25, 4), rec("hf-assisted", "a", 10, 0.9, 4)]
    low, high = ch09.bootstrap_speedup(records, "greedy", "code", n=400)
    assert 2.0 <= low < high <= 4.0  # one prompt alone: 2x or 4x; both: 20 / 0.75 / 10
    with pytest.raises(ValueError, match="no prompt of category 'chat'"):
        ch09.bootstrap_speedup(records, "greedy", "chat")
    assert abs(ch09.loop_overhead_ms(records, "greedy", "hf-assisted") - (0.9 / 4 - 0.75 / 8) * 1e3) < 1e-9
