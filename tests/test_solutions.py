"""The exercise solutions in notebooks/solutions/ are code a learner compares against: they must work."""
import importlib.util
from pathlib import Path

import pytest
import torch

from specdec_utils import generate
from specdec_utils.core.engine import RoundStats
from specdec_utils.speculative import autoregressive_generate, forward_uncached
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
    before = generate(target, input_ids, 30, method=ch04.EntropyStopBefore(theta=5.0), draft=draft)
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
    from specdec_utils.core.stop_head import StopHead
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
    from specdec_utils import measure
    variants = ch05.theta2_sweep((0.5, 2.0))
    assert [v.params.get("theta2") for v in variants] == [0.5, 2.0, None, None]
    assert all(v.draft_small == "ngram" for v in variants[:3]) and variants[-1].method == "entropy-stop"
    target = random_model("tiny-llama", seed=0)
    middle = noisy_copy(target, noise=0.01, seed=1)
    from specdec_utils.core.ngram import NgramDraft
    table = NgramDraft({3: {}, 2: {}}, vocab_size=target.config.vocab_size)
    input_ids = random_prompt(6, 2)
    for variant in variants[:3]:
        result = generate(target, input_ids, 20, method=variant.method, draft=middle, draft_small=table,
                          params=variant.params)
        assert result.new_token_ids == generate(target, input_ids, 20, method="ar").new_token_ids
    assert isinstance(variants[0], measure.Variant)


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
    from specdec_utils.core.ngram import NgramDraft
    table = NgramDraft.build([([5, 6, 7, 8, 5, 6, 7, 9], 0)], vocab_size=20, min_count=1)
    assert table.lookup([0, 5, 6, 7]) is not None
    lookup_only = ch05.context_only(table)
    assert lookup_only.lookup([0, 5, 6, 7]) is None
    assert lookup_only.lookup([5, 6, 7, 1, 5, 6, 7]) == ([1], [1])


@pytest.fixture(scope="module")
def ch06():
    return load("ch06")


def test_ch06_sparse_tree_by_scan_matches_the_heap(ch06):
    from specdec_utils.core import tree as trees
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


def test_ch07_mask_positions_and_tau():
    from specdec_utils.core.eagle import eagle_head_for
    from specdec_utils.core.hidden import capture_hidden
    ch07 = load("ch07")
    # 1. the mask: closed-form count, the 3 x 2 case by hand, and never a later position
    assert int(ch07.ttt_mask(3, 2).sum()) == ch07.allowed_pairs(3, 2) == 15 and ch07.causal_pairs(3, 2) == 21
    for n, steps in [(1, 1), (5, 1), (4, 3), (7, 5)]:
        mask = ch07.ttt_mask(n, steps)
        assert int(mask.sum()) == ch07.allowed_pairs(n, steps)
        pos = torch.arange(n).repeat(steps)
        assert not (mask & (pos[None, :] > pos[:, None])).any()
    # 2. the right positions equal the package's training forward; the bug changes every step after the first
    target = random_model("tiny-llama", 0)
    head = eagle_head_for(target, seed=1).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    ids = random_prompt(12, 0)[0]
    with torch.no_grad(), capture_hidden(target, head.features) as captured:
        target(input_ids=ids[None])
        features = captured[0][0]
        mine = ch07.ttt_forward_positions(head, features, ids, 3)
        theirs = head.ttt_forward(features[None], ids[None], 3)
    assert all(torch.allclose(mine[k], theirs[k][0], rtol=1e-4, atol=1e-4) for k in range(3))
    gaps = ch07.position_bug_gap(head, features, ids, 3)
    assert gaps[0] < 1e-5 and min(gaps[1:]) > 1e-3
    # 3. tau from per-step agreement, and the shipped head's committed numbers
    assert ch07.expected_chain_tau([1.0, 1.0, 1.0], 3) == 4.0
    assert ch07.expected_chain_tau([0.5, 0.5], 2) == pytest.approx(1.75)
    assert ch07.expected_chain_tau([0.5], 3) == pytest.approx(1.875)  # past the list: its last value
    numbers = ch07.shipped_head_numbers()
    assert numbers["predicted"][4] > numbers["held_out"][4] > 1.0


def test_ch08_ancestors_by_lifting_and_bytes():
    import random

    from specdec_utils.core.tree import tree_mask
    ch08 = load("ch08")
    rng = random.Random(0)
    chain = torch.arange(256) - 1
    mask, steps = ch08.ancestor_mask_by_lifting(chain)
    assert torch.equal(mask, tree_mask(chain)) and steps <= 10
    for T in (1, 2, 9, 70, 256):
        parents = torch.tensor([-1] + [rng.randrange(max(-1, i - 8), i) for i in range(1, T)])
        mask, steps = ch08.ancestor_mask_by_lifting(parents)
        assert torch.equal(mask, tree_mask(parents)), T
    star = torch.full((5,), -1)
    assert torch.equal(ch08.ancestor_mask_by_lifting(star)[0], torch.eye(5, dtype=torch.bool))
    # P = 1024, T = 64, head_dim 64, bf16, 9 query heads on 3 KV heads
    first, packed, per_head = (ch08.kv_bytes(1024, 64, 64, 2, h, blocks) for h, blocks in ((9, 4), (3, 4), (9, 1)))
    assert first == 2 * 9 * 4 * 1088 * 64 * 2 and first == 3 * packed and per_head * 4 == first
    assert ch08.mask_bytes(1024, 64) == 64 * 1088


def test_ch09_bound_and_buffer_bytes():
    import json
    ch09 = load("ch09")
    assert ch09.expected_tau(0.0, 4) == 1 and ch09.expected_tau(1.0, 4) == 5
    assert abs(ch09.expected_tau(0.5, 2) - 1.75) < 1e-12
    rows = [(g, ch09.expected_tau(0.7, g)) for g in (2, 4, 6)]
    assert ch09.fit_alpha(rows) == 0.7
    assert abs(ch09.predicted_tok_per_s(0.5, 2, 4.0, 0.5, 1.0) - 1.75 / 6.0 * 1e3) < 1e-9
    bench = json.loads(ch09.BENCH.read_text())
    compared = ch09.compare(bench)
    assert [g for g, _, _ in compared] == [2, 3, 4, 5, 6]
    assert all(0.7 < predicted / measured < 1.3 for _, measured, predicted in compared)
    assert (ch09.kv_bytes_per_step(1024, 30, 3, 64, 2) == 2 * 30 * 3 * 1024 * 64 * 2
            == 4 * ch09.kv_bytes_per_step(256, 30, 3, 64, 2))


def test_ch10_bootstrap_and_loop_overhead():
    ch10 = load("ch10")

    def rec(method, prompt, tokens, wall, calls):
        return {"id": prompt, "method": method, "category": "code", "new_tokens": tokens, "wall_s": wall,
                "target_calls": calls}
    records = [rec("ar", "a", 10, 1.0, 10), rec("ar", "b", 10, 1.0, 10),
               rec("greedy", "a", 10, 0.5, 4), rec("greedy", "b", 10, 0.25, 4), rec("hf-assisted", "a", 10, 0.9, 4)]
    low, high = ch10.bootstrap_speedup(records, "greedy", "code", n=400)
    assert 2.0 <= low < high <= 4.0  # one prompt alone: 2x or 4x; both: 20 / 0.75 / 10
    with pytest.raises(ValueError, match="no prompt of category 'chat'"):
        ch10.bootstrap_speedup(records, "greedy", "chat")
    assert abs(ch10.loop_overhead_ms(records, "greedy", "hf-assisted") - (0.9 / 4 - 0.75 / 8) * 1e3) < 1e-9


def test_ch04_answers_in_words_and_matching_cost(ch04):
    assert sorted(ch04.ANSWERS) == [1, 2, 3, 4] and all(len(a.split()) > 30 for a in ch04.ANSWERS.values())
    flat = {k: 10.0 + 0.1 * (k - 1) for k in range(1, 12)}     # verification nearly free
    steep = {k: 10.0 + 4.0 * (k - 1) for k in range(1, 12)}    # every verified position costs
    assert ch04.matching_cost(1.0, flat) > 3 > ch04.matching_cost(1.0, steep)
    assert ch04.matching_cost(1.0, flat) == pytest.approx(10.0 / 1.1)


# --------------------------------------------------------------------------- notebooks 00 and 01
def test_ch00_answers_in_words():
    ch00 = load("ch00")
    assert sorted(ch00.ANSWERS) == [1, 2, 3, 4, 5, 6]
    assert all("Answer:" in a and len(a.split("Answer:")[1].split()) > 30 for a in ch00.ANSWERS.values())


def test_ch00_best_gamma_with_measured_verification_cost():
    ch00 = load("ch00")
    new_tokens = (1, 2, 4, 8, 16)
    flat, steep = [10.0] * 5, [10.0, 15.0, 25.0, 45.0, 85.0]   # free verification / every token costs half a step
    assert ch00.verify_cost_ratio(new_tokens, steep, 3) == pytest.approx(2.0)
    assert ch00.best_gamma_measured(0.7, 0.05, new_tokens, flat) == ch00.textbook_gamma(0.7, 0.05)
    assert ch00.best_gamma_measured(0.7, 0.05, new_tokens, steep) < ch00.textbook_gamma(0.7, 0.05)
    assert ch00.speedup_with_measured_verify(0.7, 4, 0.05, 1.0) == pytest.approx(
        (1 - 0.7 ** 5) / (0.3 * 1.2))


def test_ch00_measurements_run_on_a_tiny_model():
    ch00 = load("ch00")
    model = random_model("tiny-llama", seed=0)
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    assert ch00.kv_cache_bytes(config, 512, 4) == 2 * layers * kv_heads * head_dim * 512 * 4
    assert ch00.forward_ms_at(model, 16, 2, repeats=2) > 0
    rates = ch00.matmul_rates(64, 128, rows=(1, 16), repeats=2)
    assert set(rates) == {1, 16} and all(r > 0 for r in rates.values())
    threads = torch.get_num_threads()
    slowdown = ch00.thread_slowdown(model, (1, 4), prompt_len=8, repeats=2)
    assert set(slowdown) == {1, 4} and torch.get_num_threads() == threads

    @torch.no_grad()
    def greedy_decode(model, input_ids, steps):
        return autoregressive_generate(model, input_ids, steps).new_token_ids
    result = ch00.generate_vs_loop(model, random_prompt(5, 0), 6, greedy_decode)
    assert result["same_tokens"] and result["loop_ms"] > 0 and result["generate_ms"] > 0


def test_ch01_answers_in_words():
    ch01 = load("ch01")
    assert sorted(ch01.ANSWERS) == [1, 2, 3, 4, 5, 6]
    assert all("Answer:" in a and len(a.split("Answer:")[1].split()) > 30 for a in ch01.ANSWERS.values())


def test_ch01_best_draft_weighs_alpha_against_cost():
    ch01 = load("ch01")
    t_verify = {k: 10.0 + 0.5 * (k - 1) for k in range(1, 10)}
    result = ch01.best_draft({"cheap": (0.55, 0.4), "good": (0.6, 2.0)}, 10.0, t_verify)
    assert result["winner"] == "cheap" and result["cheap"][0] >= result["good"][0]
    drafts = {"same-cost-better": (0.8, 1.0), "worse": (0.5, 1.0)}
    assert ch01.best_draft(drafts, 10.0, t_verify)["winner"] == "same-cost-better"


def test_ch01_counts_passes_and_two_token_first_draft_pass():
    from specdec_utils.core.kv_cache import cache_length, trim_cache

    from conftest import teaching_namespace
    ch01 = load("ch01")
    notebook = teaching_namespace("01_greedy_speculative_decoding.ipynb",
                                  {"torch": torch, "forward_uncached": forward_uncached, "trim_cache": trim_cache,
                                   "cache_length": cache_length}, min_cells=2)
    target = random_model("tiny-llama", seed=0)
    input_ids = random_prompt(6, 1)
    for draft, fully_accepted in ((noisy_copy(target, noise=0.0, seed=0), True),
                                  (random_model("tiny-llama", seed=2), False)):
        counted = ch01.count_passes(notebook["greedy_speculative_generate"], target, draft, input_ids, 20, 4)
        assert counted["target_passes"] == len(counted["rounds"])
        assert counted["draft_passes"] == sum(k for k, _ in counted["rounds"])
        assert counted["first_pass_tokens"][0] == 6  # the prefill
        after = [(prev_a == prev_k, n)
                 for (prev_k, prev_a), n in zip(counted["rounds"], counted["first_pass_tokens"][1:]) if n]
        assert all(n == (2 if full else 1) for full, n in after)
        assert any(full for full, _ in after) == fully_accepted


def test_ch01_self_draft_and_prompt_lookup():
    ch01 = load("ch01")
    target = random_model("tiny-llama", seed=0)
    result = ch01.self_draft(target, random_prompt(5, 0), 15, 4)
    assert result["tau"] == 5 and result["same_as_plain"]
    assert ch01.self_draft_slowdown(4, 1.0) == 1.0 and ch01.self_draft_slowdown(4, 1.5) > 1
    assert ch01.prompt_lookup_propose([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]
    assert ch01.prompt_lookup_propose([1, 2, 3], 3) == []
    repeated = torch.tensor([list(range(10, 30)) * 2 + list(range(10, 14))])
    new_ids, rounds = ch01.prompt_lookup_generate(target, repeated, 24, gamma=4)
    assert new_ids == autoregressive_generate(target, repeated, 24).new_token_ids
    assert all(0 <= a <= k <= 4 for k, a in rounds)


def test_ch01_bf16_flips_agree_in_float32():
    ch01 = load("ch01")
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.01, seed=1)
    assert ch01.bf16_flips(target, draft, [random_prompt(5, 0), random_prompt(7, 1)], 4, 12) == [None, None]


def test_ch06_answers_in_words_and_the_committed_head_fall(ch06):
    assert set(ch06.ANSWERS) == {1, 2, 3} and all(len(text) > 200 for text in ch06.ANSWERS.values())
    assert "1.91" in ch06.ANSWERS[1] and "0.8" in ch06.ANSWERS[2]
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.6, 0.2])
    (_, _), (drawn_accept, _) = ch06.compare_one_hot_and_drawn(p, q)
    assert f"{drawn_accept:.2f}" in ch06.ANSWERS[2]
    top1 = ch06.committed_head_fall()
    assert len(top1) == 4 and top1[0] > top1[2] > 0


# --------------------------------------------------------------------------- notebook 02
@pytest.fixture(scope="module")
def ch02():
    return load("ch02")


@pytest.mark.stat
def test_ch02_planted_bug_is_biased_toward_the_draft_and_caught(ch02):
    p, q = ch02.P_TOY, ch02.Q_TOY
    emitted = ch02.planted_bug_emission(p, q)
    torch.testing.assert_close(emitted.sum(), torch.tensor(1.0, dtype=torch.float64))
    over_proposed = q >= p
    assert (emitted[over_proposed] > p[over_proposed]).all()           # toward the draft
    level = ch02.planted_bug_level(p, q)
    assert level > 0.1
    n = 20_000                                                          # the sampled bug sits at the exact level
    tokens = ch02.first_tokens(p, q, n, torch.Generator().manual_seed(0), after_rejection="p")
    assert abs(ch02.tv(torch.bincount(tokens, minlength=len(p)).double() / n, p) - level) < 0.02
    correct = ch02.first_tokens(p, q, n, torch.Generator().manual_seed(1))
    assert ch02.tv(torch.bincount(correct, minlength=len(p)).double() / n, p) < 0.02
    p_values = ch02.chi_square_catches_the_bug(p, q, n=5_000)
    assert p_values["correct"] > 1e-3 and p_values["planted bug"] < 1e-10
    markov = torch.Generator().manual_seed(0)
    P = (1.5 * torch.randn(8, 8, generator=markov)).softmax(-1)
    Q = (P.log() + torch.randn(8, 8, generator=markov)).softmax(-1)
    assert ch02.planted_bug_pair_level(P, P, 0) < 1e-6 < 0.01 < ch02.planted_bug_pair_level(P, Q, 0)
    assert 0.1 < ch02.planted_bug_pair_level(*ch02.toy_markov(), start=0) < 0.3  # section 3's flat red curve


@pytest.mark.stat
def test_ch02_match_a_target_sample_is_exact_and_keeps_less(ch02):
    draft_probs = torch.tensor([[0.05, 0.40, 0.30, 0.05, 0.10, 0.10], [0.30, 0.05, 0.05, 0.40, 0.10, 0.10]])
    target_probs = torch.tensor([[0.35, 0.10, 0.10, 0.25, 0.05, 0.15], [0.05, 0.40, 0.30, 0.05, 0.10, 0.10],
                                 [1 / 6] * 6])
    generator = torch.Generator().manual_seed(0)
    outs = []
    for _ in range(3_000):
        drafts = torch.tensor([int(torch.multinomial(row, 1, generator=generator)) for row in draft_probs])
        outs.append(ch02.match_target_sample(draft_probs, target_probs, drafts, generator))
    first = torch.bincount(torch.stack([o[0] for o in outs]), minlength=6) / len(outs)
    assert ch02.tv(first, target_probs[0]) < 0.04
    kept_first = sum(len(o) > 1 for o in outs) / len(outs)
    fractions = ch02.kept_fractions(target_probs[0], draft_probs[0])
    assert abs(kept_first - fractions["match a target sample"]) < 0.03
    assert fractions["match a target sample"] < fractions["rejection sampling"]


def test_ch02_alpha_speedup_and_vocabulary_cap(ch02):
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.05, seed=1)
    text = random_prompt(12, 0)
    assert abs(ch02.mean_alpha(target, target, text, temperature=0.7) - 1) < 1e-6
    alpha = ch02.mean_alpha(target, draft, text, temperature=1.0)
    assert 0 < alpha < 1
    assert ch02.predicted_speedup(alpha, 4, 0.0) > ch02.predicted_speedup(alpha, 4, 0.2) > 0
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    assert torch.allclose(ch02.vocabulary_cap(p, torch.full((2, 3), 1 / 3)), torch.ones(2))
    torch.testing.assert_close(ch02.vocabulary_cap(p, torch.tensor([[0.5, 0.5, 0.0]] * 2)), torch.tensor([0.8, 0.2]))
    cost = ch02.vocabulary_cost(target, draft, text)
    assert cost["mean alpha"] <= cost["mean cap"] + 1e-6 and abs(cost["largest cost"] - (1 - cost["mean cap"])) < 1e-9


def test_ch02_lenient_rule_trades_exactness_for_kept_drafts(ch02):
    p, q = ch02.P_TOY, ch02.Q_TOY
    kept, distance = ch02.lenient_rule(p, q, 1.0)
    assert abs(kept - torch.minimum(p, q).sum().item()) < 1e-12 and distance < 1e-12
    results = [ch02.lenient_rule(p, q, lam) for lam in (1.0, 0.9, 0.75, 0.5)]
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in zip(results, results[1:]))
    assert abs(results[-1][0] - 1) < 1e-12 and abs(results[-1][1] - ch02.tv(p, q)) < 1e-12
    tokens, kept_sampled = ch02.lenient_first_tokens(p, q, 0.75, 20_000, torch.Generator().manual_seed(0))
    assert abs(kept_sampled - results[2][0]) < 0.02
    assert abs(ch02.tv(torch.bincount(tokens, minlength=len(p)).double() / 20_000, p) - results[2][1]) < 0.02


def test_ch02_simulation_along_alpha(ch02):
    long = [torch.full((3_000,), 0.6)]
    simulated = ch02.simulate_tokens_per_pass(long, 4, repeats=3)
    formula = (1 - 0.6 ** 5) / (1 - 0.6)
    assert abs(simulated - formula) / formula < 0.02
    short = [torch.full((8,), 0.6)] * 20                                 # the budget cuts the last rounds short
    assert ch02.simulate_tokens_per_pass(short, 6, repeats=50) < formula
    assert ch02.simulate_tokens_per_pass([torch.ones(12)], 3, repeats=1) == 4.0
    parts = ch02.gap_decomposition(short, 4, measured=1.9, repeats=20)
    assert set(parts) == {"formula", "simulated, constant α with the budget", "simulated along the measured α_t",
                          "measured"}
    assert parts["simulated, constant α with the budget"] < parts["formula"]


def test_ch08_to_ch10_state_their_answers():
    """Each solution module says its answers in words (its docstring) and computes the numbers behind them."""
    ch08, ch09, ch10 = load("ch08"), load("ch09"), load("ch10")
    for module, words in ((ch08, ("doubling steps", "latency")), (ch09, ("not i.i.d.", "Bandwidth is not the bound")),
                          (ch10, ("three distinct resamples", "the engine, not HF's loop"))):
        assert all(w in module.__doc__ for w in words), module.__name__
    first, second, third = ch08.answers()
    assert "7 doubling steps" in first and "a 256-deep chain: 9" in first and "10.03 MB" in second
    fit, buffer = ch09.answers()
    assert "fitted alpha 0.66" in fit and "gamma 6: measured 411" in fit
    assert "23.6 MB per step" in buffer and "52 us per attention call" in buffer
    lines = ch10.answers()
    assert sum(line.startswith("1. ") for line in lines) == 5 and any("code: 5-95% interval" in line for line in lines)
    assert any("gpu_h100_bfloat16:" in line and "holds" in line for line in lines)
    assert any("graphed" in line and "ours replays graphs" in line for line in lines)


# notebook 03: the answers in words, and the code behind the conceptual halves ----------------------------
def test_ch03_answers_every_exercise_in_words(ch03):
    for n in range(1, 5):
        answer = getattr(ch03, f"ANSWER_{n}")
        assert isinstance(answer, str) and len(answer.split()) > 40


def test_ch03_multiplicative_reacts_faster_on_easy_and_much_better_on_hard_stretches(ch03):
    moderate = ch03.easy_then_hard(60, 40)
    assert moderate["easy"]["multiplicative"]["rounds"] < moderate["easy"]["adaptive-hf"]["rounds"]
    assert moderate["easy then hard"]["multiplicative"]["wasted"] < moderate["easy then hard"]["adaptive-hf"]["wasted"]
    very_long = ch03.easy_then_hard(300, 40)["easy"]  # no cap on Hugging Face's schedule: it catches up
    assert very_long["adaptive-hf"]["rounds"] <= very_long["multiplicative"]["rounds"]


def test_ch03_category_gain(ch03):
    easy = [stats(8, 8)] * 10 + [stats(8, 6)] * 5
    hard = [stats(8, 0)] * 12 + [stats(8, 1)] * 3
    t_verify = {k: 10.0 + 0.2 * (k - 1) for k in range(1, 10)}
    result = ch03.category_gain({"code": easy, "stories": hard}, 1.0, t_verify)
    assert result["own_gamma"] == {"code": 8, "stories": 1}
    assert result["gain"] > 1.0
    same = ch03.category_gain({"a": easy, "b": list(easy)}, 1.0, t_verify)
    assert same["gain"] == pytest.approx(1.0) and same["shared_gamma"] == 8


def test_ch05_states_its_answers_in_words(ch05):
    """Every exercise of notebook 05 has its answer in words, and the script prints the numbers behind them."""
    assert set(ch05.ANSWERS) == {1, 2, 3, 4} and all(len(words) > 200 for words in ch05.ANSWERS.values())
    lines = ch05.answers()
    assert [line[:2] for line in lines[:4]] == ["1.", "2.", "3.", "4."]
    assert "TV = 0.214" in lines[1]                       # notebook 02's toy vectors
    assert "a12 >= 0.55" in lines[2] and "a12 >= 0.9" in lines[2]
    levels = ch05.logged_lookup_levels()
    assert levels["with_context"]["coverage"] > levels["context_only"]["coverage"]
    assert levels["context_only"]["hit_rate"] > levels["with_context"]["hit_rate"]


def test_ch05_tau2_sweep_is_judged_with_its_spread(ch05):
    records = []
    for prompt in range(6):
        for label, seconds in (("ngram > draft-s theta2 0.5", 1.0), ("ngram > draft-s theta2 3", 2.0),
                               ("ngram > draft-s adaptive", 1.0 + 0.01 * (prompt % 2)), ("draft-s entropy-stop", 1.0)):
            records.append({"id": prompt, "method": label, "new_tokens": 64, "wall_s": seconds})
    fast, slow = ch05.judge_theta2_sweep(records)
    assert "theta2 0.5" in fast and "(a tie within the spread)" in fast
    assert "theta2 3" in slow and "(slower)" in slow


def test_ch08_tiled_kernel_matches_sdpa():
    """Exercise 3's single-program Triton kernel with the online softmax over key tiles, in the CPU interpreter
    (compiled on a GPU), against SDPA with the mask, on prefixes of one tile and of several."""
    import random
    ch08 = load("ch08")
    if not ch08.ta.AVAILABLE:
        pytest.skip(ch08.ta.WHY)
    rng = random.Random(1)
    for T, P in ((1, 0), (7, 5), (16, 20), (10, 100)):
        parents = torch.tensor([-1] + [rng.randrange(-1, i) for i in range(1, T)])
        mask = ch08.ta.mask_from_parents(parents, P)
        device = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on a GPU, interpreted on a CPU
        q = torch.randn(T, 64, device=device)
        k, v = torch.randn(P + T, 64, device=device), torch.randn(P + T, 64, device=device)
        mask = mask.to(device)
        reference = ch08.ta.reference(q[None, None], k[None, None], v[None, None], mask)[0, 0]
        torch.testing.assert_close(ch08.tiled_tree_attention(q, k, v, mask), reference, atol=1e-5, rtol=1e-5)
    assert ch08.tiled_check() < 1e-5 and "3. tiled_tree_attention: largest" in ch08.answers()[2]


def test_ch11_mask_count_tau_and_break_even():
    from specdec_utils.core.block import block_mask
    ch11 = load("ch11")
    for starts, n, b in (([2, 5, 8], 10, 4), ([1], 3, 2), ([3, 4], 9, 5)):
        mask = ch11.training_mask(starts, n, b)
        assert int(mask.sum()) == ch11.allowed_pairs(starts, b)
        assert torch.equal(mask[:, :n], block_mask(torch.tensor([starts]), n)[0].repeat_interleave(b, 0))
        assert not mask[:b, n + b:].any()  # a block never reads another block
    assert ch11.expected_tau([1.0, 1.0, 1.0], 3) == 4.0
    assert abs(ch11.expected_tau([0.5, 0.5], 2) - 1.75) < 1e-12
    assert ch11.expected_tau([0.5, 0.5, 0.9], 2) == ch11.expected_tau([0.5, 0.5], 2)  # gamma caps the round
    tau_chain, r_chain, r_block = 2.5, 2.0, 1.2
    tie = ch11.break_even(tau_chain, r_chain, r_block)
    assert abs(tie / r_block - tau_chain / r_chain) < 1e-12
    ch11.main()  # reads the committed measurements and prints every answer
