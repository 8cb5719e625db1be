"""The greedy round on the device (core/device_loop.py): lossless against the target alone, and it accepts drafts.

On the CPU the round runs op by op (the same tensor operations a CUDA graph records); the recording itself is
checked by the CUDA-only test at the end and on the GPU by `specdec_lab/tree_graph_bench.py --part device`."""
import copy

import pytest
import torch

from specdec_utils import generate
from specdec_utils.core import eagle
from specdec_utils.core.device_loop import DeviceLoop, DeviceTreeLoop
from specdec_utils.core.engine import Sampler
from specdec_utils.core.sampling import draw
from specdec_utils.exactness import chi_square_p_value, exact_distribution, sample_outputs
from specdec_utils.models import tiny_model

from conftest import noisy_copy, random_eagle_head, random_model, random_prompt

pytestmark = pytest.mark.usefixtures("single_thread")


def loops(target, draft, head):
    return {"ar": DeviceLoop(target, gamma=0), "greedy 1": DeviceLoop(target, draft=draft, gamma=1),
            "greedy 4": DeviceLoop(target, draft=draft, gamma=4),
            "eagle-chain 5": DeviceLoop(target, head=head, gamma=5)}


def test_every_round_gives_the_target_alones_tokens():
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.02, seed=1)
    head = random_eagle_head(target, 2)
    cases = loops(target, draft, head)
    for seed, length in ((5, 2), (6, 9), (7, 17)):  # 2: the shortest prompt the loop takes
        ids = random_prompt(length, seed=seed)
        reference = generate(target, ids, 40, method="ar").new_token_ids
        for name, loop in cases.items():  # one loop per method, reused across prompts (as the benchmark does)
            assert loop.generate(ids, 40).new_token_ids == reference, (name, seed)
    assert cases["greedy 4"].generate(ids, 40).tokens_per_round > 1.5  # the noisy copy's drafts are mostly accepted


def test_a_draft_equal_to_the_target_has_every_draft_accepted():
    target = random_model("tiny-llama", seed=3)
    ids = random_prompt(7, seed=1)
    out = DeviceLoop(target, draft=copy.deepcopy(target), gamma=3).generate(ids, 40)
    assert out.new_token_ids == generate(target, ids, 40, method="ar").new_token_ids
    assert out.accepted_per_round == [3] * 10 and out.tokens_per_round == 4.0


def test_eos_stops_and_the_cache_grows():
    target = random_model("tiny-llama", seed=4)
    draft = noisy_copy(target, noise=0.02, seed=2)
    ids = random_prompt(6, seed=3)
    reference = generate(target, ids, 300, method="ar").new_token_ids
    loop = DeviceLoop(target, draft=draft, gamma=4, capacity=64)
    assert loop.generate(ids, 300).new_token_ids == reference  # past its first capacity
    assert loop.capacity >= 6 + 300
    loop.set_gamma(2)  # a new gamma: the same tokens
    assert loop.generate(ids, 300).new_token_ids == reference
    with pytest.raises(ValueError, match="set_gamma takes"):
        loop.set_gamma(0)
    eos = reference[12]
    stopped = generate(target, ids, 300, method="ar", eos_token_id=eos).new_token_ids
    assert loop.generate(ids, 300, eos_token_id=eos).new_token_ids == stopped
    assert stopped[-1] == eos and len(stopped) <= 13


def test_a_reduced_vocabulary_head_and_an_eagle1_head():
    target = random_model("tiny-llama", seed=5)
    ids = random_prompt(11, seed=4)
    reference = generate(target, ids, 30, method="ar").new_token_ids
    for options in ({"vocab_ids": torch.arange(0, 64, 2)}, {"layer": "eagle1"}):
        head = eagle.eagle_head_for(target, seed=3, **options).eval()
        assert DeviceLoop(target, head=head, gamma=4).generate(ids, 30).new_token_ids == reference


def test_the_loop_refuses_what_it_cannot_run():
    target = tiny_model("tiny-llama", vocab_size=64)
    with pytest.raises(ValueError, match="gamma must be an integer"):
        DeviceLoop(target, gamma=-1)
    with pytest.raises(ValueError, match="needs a draft model, an EAGLE head or a block drafter"):
        DeviceLoop(target, gamma=3)
    with pytest.raises(ValueError, match="drafts nothing"):
        DeviceLoop(target, draft=target, gamma=0)
    with pytest.raises(ValueError, match="not several"):
        DeviceLoop(target, draft=target, head=eagle.eagle_head_for(target), gamma=2)
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        DeviceLoop(target, graphs=True, gamma=0)
    with pytest.raises(ValueError, match="compile must be"):
        DeviceLoop(target, gamma=0, compile="fast")
    with pytest.raises(ValueError, match="plain Llama"):
        DeviceLoop(tiny_model("tiny-gpt2", vocab_size=64), gamma=0)
    loop = DeviceLoop(target, gamma=0)
    with pytest.raises(ValueError, match="one prompt at a time"):
        loop.generate(torch.ones(2, 5, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        loop.generate(torch.tensor([[5, 6]]), 0)
    # the engine's words (`generate`): an empty prompt, a bool for a count, float ids
    for prompt, n, message in ((torch.zeros(1, 0, dtype=torch.long), 4, "input_ids must hold at least one token"),
                               (torch.tensor([[5, 6]]), True, "max_new_tokens must be an integer >= 1, got True"),
                               (torch.tensor([[5.0, 6.0]]), 4, "input_ids must hold integer token ids")):
        with pytest.raises(ValueError, match=message):
            loop.generate(prompt, n)
        with pytest.raises(ValueError, match=message):
            generate(target, prompt, n, method="ar")


# ------------------------------------------------------------------------------ one rule for both executors
def test_a_one_token_prompt_runs_on_the_device():
    """A one-token prompt (the engine takes it): the target's pass over that token is the prefill and gives the
    first new token, as the engine's first round of an EAGLE head (no features yet: nothing drafted); then the loop
    goes on as for a two-token prompt. Every loop writes the target alone's tokens; that pass is one target call and
    one round that drafted nothing."""
    from specdec_utils.core.block import block_drafter_for
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.02, seed=1)
    head = random_eagle_head(target, 2)
    cases = loops(target, draft, head)
    cases["eagle tree 3x2x5"] = DeviceTreeLoop(target, head, depth=3, topk=2, nodes=5)
    cases["block 3"] = DeviceLoop(target, drafter=block_drafter_for(target, block_size=4), gamma=3)
    for seed in (5, 6):
        ids = random_prompt(1, seed=seed)
        for n in (1, 2, 30):
            reference = generate(target, ids, n, method="ar").new_token_ids
            for name, loop in cases.items():
                out = loop.generate(ids, n)
                assert out.new_token_ids == reference, (name, seed, n)
                first = out.rounds[0]
                assert (first.drafted, first.accepted, first.new_tokens, first.stop) == (0, 0, 1, "no draft"), name
                assert out.target_calls == len(out.rounds), name  # the prefill's pass made a token: it is a round
                assert out.draft_calls == sum(r.draft_calls for r in out.rounds), name
        assert cases["greedy 4"].generate(ids, 30).tokens_per_round > 1.5


def test_a_sampled_one_token_prompt_draws_what_the_engine_draws():
    """The first token of a one-token prompt is drawn from the target's warped distribution with one uniform, as the
    engine's first EAGLE round draws it: the same seed gives the engine's tokens (up to its first round that drafts
    less than the device's, near the budget)."""
    target = random_model("tiny-llama", seed=0, vocab=16)
    head = random_eagle_head(target, 2)
    for seed in range(3):
        ids = random_prompt(1, seed=seed, vocab=16)
        for method, loop, params in (
                ("eagle-chain", DeviceLoop(target, head=head, gamma=4, temperature=1.0), None),
                ("eagle", DeviceTreeLoop(target, head, depth=4, topk=3, nodes=10, temperature=1.0),
                 {"width": 3, "tree_nodes": 10})):
            engine = generate(target, ids, 40, method=method, eagle=head, gamma=4, temperature=1.0, params=params,
                              generator=torch.Generator().manual_seed(seed))
            got = loop.generate(ids, 40, generator=torch.Generator().manual_seed(seed))
            made = [sum(r.new_tokens for r in engine.rounds[:i]) for i in range(len(engine.rounds) + 1)]
            k = next(i for i in range(len(engine.rounds) + 1) if i == len(engine.rounds) or 40 - made[i] <= 4)
            n = made[k]  # the tokens of the rounds before the first one the budget cut (depth or chain of 4)
            assert n >= 20 and got.new_token_ids[:n] == engine.new_token_ids[:n], (method, seed)
            assert [r.accepted for r in got.rounds[:k]] == [r.accepted for r in engine.rounds[:k]], (method, seed)


def round_counts(result, rounds=slice(None)):
    """What both executors must agree on (`GenerationResult`'s docstring): the tokens, and round by round the
    accepted drafts, the new tokens and the stop reason."""
    return {"tokens": result.new_token_ids,
            "rounds": [(r.accepted, r.new_tokens, r.stop) for r in result.rounds[rounds]]}


def test_the_two_executors_count_alike_up_to_the_budget():
    """Same method, same prompt, the engine and `DeviceExecutor`: the same tokens and, round by round, the same
    accepted drafts, new tokens and stop reason ("budget" where the budget left less than gamma + 1 tokens), so the
    same accepted, accepted_per_position and tokens_per_round; the device loop runs one more target pass (its prefill
    commits no token) and drafts gamma tokens in the budget's round too, past the ones it keeps."""
    from specdec_utils.core.device_loop import DeviceExecutor
    target = random_model("tiny-llama", seed=0, vocab=6)  # a small vocabulary: drafts are kept often
    draft = noisy_copy(target, noise=0.2, seed=1)
    executor = DeviceExecutor()
    budget_rounds = 0
    for seed in range(3):
        ids = random_prompt(8, seed=seed, vocab=6)
        for method, gamma in (("draft", 4), ("draft", 3), ("ar", None)):
            for n in (1, 2, 5, 17, 18, 19, 20, 31):
                engine = generate(target, ids, n, method=method, draft=draft, gamma=gamma)
                device = generate(target, ids, n, method=method, draft=draft, gamma=gamma, executor=executor)
                case = (seed, method, gamma, n)
                assert round_counts(device) == round_counts(engine), case
                assert (device.accepted, device.accepted_per_position) == \
                       (engine.accepted, engine.accepted_per_position), case
                assert device.tokens_per_round == engine.tokens_per_round, case
                assert device.target_calls == engine.target_calls + 1 == len(device.rounds) + 1, case
                assert device.drafted == len(device.rounds) * (gamma or 0) >= engine.drafted, case
                budget_rounds += device.rounds[-1].stop == "budget"
    assert budget_rounds > 20


def test_an_eagle_chain_counts_alike_on_both_executors():
    """An EAGLE chain: the engine's first round has no features and drafts nothing; from the prompt and that token the
    device loop drafts what the engine's later rounds draft, and counts them alike up to the budget."""
    target = random_model("tiny-llama", seed=0, vocab=6)
    head = random_eagle_head(target, 2)
    for seed in range(3):
        ids = random_prompt(8, seed=seed, vocab=6)
        for n in (7, 20, 21, 22, 23):
            engine = generate(target, ids, n, method="eagle-chain", eagle=head, gamma=4)
            prompt = torch.cat([ids, torch.tensor([engine.new_token_ids[:1]])], 1)
            device = DeviceLoop(target, head=head, gamma=4).generate(prompt, n - 1)
            assert device.new_token_ids == engine.new_token_ids[1:], (seed, n)
            assert round_counts(device)["rounds"] == round_counts(engine, slice(1, None))["rounds"], (seed, n)
            assert device.accepted == engine.accepted and device.accepted_per_position == engine.accepted_per_position


def test_no_executor_counts_a_draft_past_the_budget():
    """Whatever the loop (a tree's last round may keep a shorter path than the engine's smaller tree: it is not
    compared to the engine here), a round's accepted drafts are at most its new tokens - 1, the stop reason says
    when the budget cut the round, and the sums are the rounds' sums."""
    target = random_model("tiny-llama", seed=1, vocab=6)
    head = random_eagle_head(target, 3)
    ids = random_prompt(7, seed=2, vocab=6)
    for loop, full, cut in ((DeviceLoop(target, draft=copy.deepcopy(target), gamma=3), "gamma", "budget"),
                            (DeviceTreeLoop(target, head, depth=2, topk=6, nodes=42), "tree", "tree")):
        for n in (1, 2, 3, 4, 5, 29, 30, 31):
            out = loop.generate(ids, n)
            assert len(out.new_token_ids) == n
            assert all(r.accepted == r.new_tokens - 1 for r in out.rounds), (loop.method, n)
            assert out.accepted == sum(out.accepted_per_round) == sum(out.accepted_per_position)
            left = n - sum(r.new_tokens for r in out.rounds[:-1])
            last = "budget" if left == 1 else cut if left <= loop.gamma else full
            assert [r.stop for r in out.rounds] == [full] * (len(out.rounds) - 1) + [last], (loop.method, n)


def test_the_counts_follow_one_rule():
    """`GenerationResult`'s rule: a round is a target pass that commits tokens, `target_calls` every target pass. The
    engine's prefill is its first round's pass; the device loop's prefill (all of the prompt but its last token)
    commits nothing and is no round, except for a one-token prompt, whose prefill pass makes the first token."""
    target = random_model("tiny-llama", seed=3)
    ids = random_prompt(7, seed=1)
    engine = generate(target, ids, 38, method="greedy", draft=copy.deepcopy(target), gamma=3)
    assert engine.target_calls == len(engine.rounds) and engine.tokens_per_round == engine.tokens_per_target_call
    device = DeviceLoop(target, draft=copy.deepcopy(target), gamma=3).generate(ids, 38)
    assert device.target_calls == len(device.rounds) + 1 and device.tokens_per_round == 3.8
    assert device.tokens_per_target_call == 38 / 11


def test_the_executors_and_the_warp_take_the_same_arguments():
    """One set of rules (`core.checks`) for the engine's `generate`, the device loop and `warp_logits`: each value is
    taken by all three or refused by all three in the same words."""
    import numpy as np

    from specdec_utils.core.device_loop import DeviceExecutor
    from specdec_utils.core.sampling import warp_logits
    target = random_model("tiny-llama", seed=0, vocab=16)
    draft = noisy_copy(target, noise=0.1, seed=1)
    ids = random_prompt(3, seed=0, vocab=16)

    def outcome(call):
        try:
            call()
        except (ValueError, TypeError) as error:
            return f"{type(error).__name__}: {error}"
        return "taken"
    sampled = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
    taken = {"temperature": (0, 0.0, 1e-6, 0.7, np.float64(0.5)), "top_k": (0, 3, np.int64(3)),
             "top_p": (1, 1.0, 0.5, np.float32(0.9))}
    refused = {"temperature": (-1.0, 1e-9, 1e-46, float("inf"), float("nan"), True, "1"), "top_k": (-1, 2.5, True),
               "top_p": (0, 1.5, float("nan"), True)}
    for name in taken:
        for value in taken[name] + refused[name]:
            options = {**sampled, name: value}
            results = {
                "engine": outcome(lambda: generate(target, ids, 2, method="ar", **options)),
                "device": outcome(lambda: DeviceLoop(target, gamma=0, **options).generate(ids, 2)),
                "warp": outcome(lambda: warp_logits(torch.zeros(4), **options)),
            }
            assert len(set(results.values())) == 1, (name, value, results)
            assert (results["engine"] == "taken") == any(value is v for v in taken[name]), (name, value, results)
    for n in (1, np.int64(3), 0, True, 2.0):  # max_new_tokens
        results = {"engine": outcome(lambda: generate(target, ids, n, method="ar")),
                   "device": outcome(lambda: DeviceLoop(target, gamma=0).generate(ids, n))}
        assert len(set(results.values())) == 1, (n, results)
    for gamma in (np.int64(2), 2):  # a numpy gamma: the engine takes it, so the device executor does
        engine = generate(target, ids, 9, method="draft", draft=draft, gamma=gamma)
        device = generate(target, ids, 9, method="draft", draft=draft, gamma=gamma, executor=DeviceExecutor())
        assert device.new_token_ids == engine.new_token_ids and len(device.accepted_per_position) == 2
    for gamma, message in ((True, "gamma must be an integer >= 1, got True"), (0, "gamma must be an integer >= 1")):
        for executor in (None, DeviceExecutor()):
            with pytest.raises(ValueError, match=message):
                generate(target, ids, 9, method="draft", draft=draft, gamma=gamma, executor=executor)
    with pytest.raises(ValueError, match="gamma must be an integer >= 0 .*got True"):
        DeviceLoop(target, draft=draft, gamma=True)
    with pytest.raises(ValueError, match="depth must be an integer >= 1, got True"):
        DeviceTreeLoop(target, eagle.eagle_head_for(target), depth=True, topk=2, nodes=2)


def test_a_tree_whose_selection_misses_a_parent_is_an_error():
    """The tree's verified rows find each node's parent among the selected nodes; the selection is ancestor-closed (a
    child never outranks its parent), so a parent is always there. Were it not (here: a child scored above its
    parent), the round must not verify that node at some other row: the loop says so, through the read-back every
    round already does (no extra host read inside the round)."""
    target = random_model("tiny-llama", seed=0)
    loop = DeviceTreeLoop(target, random_eagle_head(target, 2), depth=2, topk=2, nodes=2)
    grow = loop._grow

    def child_above_its_parent(L):  # the pool: depth-1 nodes 0, 1; their children 2, 3 (of 0) and 4, 5 (of 1)
        tokens, scores, parents, depths = grow(L)
        return tokens, torch.tensor([0.0, -10.0, -20.0, -20.0, -1.0, -20.0]), parents, depths
    ids = random_prompt(5, seed=1)
    assert loop.generate(ids, 6).new_token_ids == generate(target, ids, 6, method="ar").new_token_ids
    loop._grow = child_above_its_parent
    with pytest.raises(RuntimeError, match="not ancestor-closed"):
        loop.generate(ids, 6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_recorded_round_gives_the_target_alones_tokens():
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.02, seed=1).cuda()
    head = random_eagle_head(target, 2)  # made on the CPU, then moved with the target
    target, head = target.cuda(), head.cuda()
    cases = loops(target, draft, head)
    cases["eagle tree 4x3x12"] = DeviceTreeLoop(target, head, depth=4, topk=3, nodes=12)
    cases["eagle tree 3x2x5, compiled"] = DeviceTreeLoop(target, head, depth=3, topk=2, nodes=5, compile=True)
    cases["eagle tree 3x2x5, round compiled"] = DeviceTreeLoop(target, head, depth=3, topk=2, nodes=5,
                                                               compile="round")
    cases["eagle-chain 3, round compiled"] = DeviceLoop(target, head=head, gamma=3, compile="round")
    cases["eagle-chain 3, triton, round compiled"] = DeviceLoop(target, head=head, gamma=3, compile="round",
                                                                attention="triton")
    cases["eagle tree 4x3x12, triton"] = DeviceTreeLoop(target, head, depth=4, topk=3, nodes=12, attention="triton")
    cases["eagle tree 3x2x5, triton, round compiled"] = DeviceTreeLoop(target, head, depth=3, topk=2, nodes=5,
                                                                       compile="round", attention="triton")
    for seed in (5, 6):
        ids = random_prompt(13, seed=seed).cuda()
        reference = generate(target, ids, 40, method="ar").new_token_ids
        for name, loop in cases.items():
            assert loop.generate(ids, 40).new_token_ids == reference, name
            assert loop.graph is not None
    for name in ("eagle tree 4x3x12", "eagle tree 3x2x5, compiled", "eagle tree 3x2x5, round compiled",
                 "eagle-chain 3, round compiled", "eagle tree 3x2x5, triton, round compiled"):
        times = cases[name].anatomy(repeats=3)
        assert set(times) == {"round_ms", "draft_ms", "verify_ms"} and min(times.values()) > 0, (name, times)
    assert set(cases["eagle-chain 3, round compiled"].anatomy(repeats=3, parts=False)) == {"round_ms"}
    # recorded again: after a new gamma, and after the buffers grow
    loop = cases["greedy 4"]
    loop.set_gamma(2)
    assert loop.generate(ids, 40).new_token_ids == reference
    long_ids = random_prompt(5, seed=9).cuda()
    assert loop.generate(long_ids, 600).new_token_ids == generate(target, long_ids, 600, method="ar").new_token_ids
    assert loop.capacity >= 605
    # sampled, recorded: the replayed round draws what the same round run op by op on the GPU draws (the same kernels,
    # the same uniforms), and a draft equal to the target has every draft kept
    for kwargs in ({"draft": draft}, {"head": head}):
        twins = [DeviceLoop(target, gamma=3, temperature=1.0, graphs=graphs, **kwargs) for graphs in (True, False)]
        outs = [twin.generate(ids, 40, generator=torch.Generator().manual_seed(3)) for twin in twins]
        assert twins[0].graph is not None and outs[0].new_token_ids == outs[1].new_token_ids, kwargs
    same = DeviceLoop(target, draft=copy.deepcopy(target), gamma=3, temperature=1.0)
    assert same.generate(ids, 40, generator=torch.Generator().manual_seed(4)).accepted_per_round == [3] * 10


def test_the_device_drafts_accept_as_often_as_the_engines():
    """Round for round, the device loop's drafts are accepted as often as the same draft's (or head's) in the
    engine: the same drafts, not only the same output."""
    target = random_model("tiny-llama", seed=0, vocab=6)  # a small vocabulary: a random head is right at times
    draft = noisy_copy(target, noise=0.2, seed=1)
    head = random_eagle_head(target, 2)
    ids = random_prompt(12, seed=8, vocab=6)
    first = generate(target, ids, 1, method="ar").new_token_ids
    for method, kwargs, skip in (("greedy", {"draft": draft}, 0), ("eagle-chain", {"head": head}, 1)):
        engine = generate(target, ids, 60, method=method, gamma=4, draft=draft, eagle=head)
        # the engine's first EAGLE round has no features yet and drafts nothing: its second round drafts from the
        # state the device loop starts from when the prompt includes the first token
        prompt = torch.cat([ids, torch.tensor([first])], 1) if skip else ids
        expected = [r.accepted for r in engine.rounds[skip:]]
        # (the engine's last rounds may draft fewer than gamma: compared up to there)
        expected = expected[:next((i for i, r in enumerate(engine.rounds[skip:]) if r.drafted < 4), len(expected))]
        got = DeviceLoop(target, gamma=4, **kwargs).generate(prompt, 60 - skip).accepted_per_round
        assert len(expected) >= 8 and got[:len(expected)] == expected, method
        assert 0 < sum(expected) < 4 * len(expected)


def test_the_loop_runs_outside_no_grad_with_a_trainable_head():
    """A learner's models have parameters that require gradients: the loop must not build an autograd graph."""
    target = random_model("tiny-llama", seed=6)
    head = eagle.eagle_head_for(target, seed=1)
    assert any(p.requires_grad for p in head.parameters())
    ids = random_prompt(8, seed=2)
    with torch.inference_mode():
        reference = generate(target, ids, 12, method="ar").new_token_ids
    loop = DeviceLoop(target, head=head, gamma=3)
    assert loop.generate(ids, 12).new_token_ids == reference
    assert not loop.h0.requires_grad  # the head's kept output carries no autograd history


def test_the_board_interleaves_the_loops_prompt_by_prompt():
    """Each prompt visits every loop once, and over as many prompts as there are loops each loop takes each place
    once: a drift of the machine cannot land on one loop's whole run."""
    from specdec_lab.tree_graph_bench import interleaved_order
    labels = ["ar", "chain", "tree", "engine"]
    orders = [interleaved_order(labels, i) for i in range(8)]
    assert all(sorted(o) == sorted(labels) for o in orders)
    for place in range(4):
        assert sorted(o[place] for o in orders[:4]) == sorted(labels)
    assert orders[0] == labels and orders[1] == ["chain", "tree", "engine", "ar"] and orders[4] == labels
    assert interleaved_order([], 3) == []


@pytest.mark.slow  # the real target, the shipped draft (a reduced vocabulary) and the shipped EAGLE head
def test_the_gpu_benchmark_device_parts_run_on_the_cpu(tmp_path):
    """`tree_graph_bench --device cpu` runs the device parts' code unrecorded: the float32 identity on the real
    target, the gamma tuning, and the board taking its gammas from the tuning's JSON."""
    import json
    import subprocess
    import sys

    from specdec_lab.provenance import earlier_draft_note
    from specdec_lab.provenance import earlier_head_note as eagle_note
    from specdec_utils.models import MODELS_DIR, weights_facts

    def run(*args):
        done = subprocess.run([sys.executable, "-m", "specdec_lab.tree_graph_bench", "--device", "cpu",
                               "--prompts", "1", "--max-new-tokens", "8", *args], capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    run("--part", "device-identity", "--extra-trees", "3x4x9", "--out", str(tmp_path / "identity.json"))
    identity = json.loads((tmp_path / "identity.json").read_text())
    assert identity["methods"] == {"ar (device)": 1, "greedy (device)": 1, "eagle-chain (device)": 1,
                                   "eagle (device)": 1, "eagle 3x4x9 (device)": 1}
    run("--part", "device-tune", "--gammas", "2,3", "--trees", "3x2x4,4x3x8", "--out", str(tmp_path / "tune.json"))
    tune = json.loads((tmp_path / "tune.json").read_text())
    assert [(r["method"], r["gamma"]) for r in tune["results"]] == [
        ("greedy (device)", 2), ("greedy (device)", 3), ("eagle-chain (device)", 2), ("eagle-chain (device)", 3),
        ("eagle (device)", 3), ("eagle (device)", 4)]
    run("--part", "device-board", "--repeats", "1", "--tuned", str(tmp_path / "tune.json"), "--float32-ar",
        "--out", str(tmp_path / "board.json"))
    board = json.loads((tmp_path / "board.json").read_text())
    assert board["gammas"]["greedy (device)"] == tune["best"]["greedy (device)"]
    assert board["tree"] == tune["best"]["eagle (device)"]
    shipped = json.loads((MODELS_DIR / "eagle-head" / "config.json").read_text())
    assert board["eagle_head"] == tune["eagle_head"] and board["eagle_head"]["from"] == "eagle-head"
    assert board["eagle_head"]["trained_steps"] == shipped["trained_steps"]  # the head each run measured, recorded
    assert eagle_note("These runs", used=board["eagle_head"]) == ""  # the shipped head: no earlier-head note
    assert board["draft_weights"] == tune["draft_weights"] == weights_facts("draft-m")  # likewise the draft's weights
    assert earlier_draft_note("These runs", used=board["draft_weights"]) == ""
    run("--part", "merge", "--inputs", f"{tmp_path / 'board.json'},{tmp_path / 'board.json'}",
        "--out", str(tmp_path / "merged.json"))
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged["eagle_head"] == board["eagle_head"] and merged["draft_weights"] == board["draft_weights"]
    other = dict(board, eagle_head=dict(board["eagle_head"], weights_sha256="0" * 16))  # a run of another head
    (tmp_path / "other.json").write_text(json.dumps(other))
    refused = subprocess.run([sys.executable, "-m", "specdec_lab.tree_graph_bench", "--part", "merge",
                              "--inputs", f"{tmp_path / 'board.json'},{tmp_path / 'other.json'}",
                              "--out", str(tmp_path / "mixed.json")], capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "differ in 'eagle_head'" in refused.stderr + refused.stdout
    (tmp_path / "tune_other.json").write_text(json.dumps(dict(tune, eagle_head=other["eagle_head"])))
    refused = subprocess.run([sys.executable, "-m", "specdec_lab.tree_graph_bench", "--device", "cpu",
                              "--prompts", "1", "--max-new-tokens", "8", "--part", "device-board", "--repeats", "1",
                              "--tuned", str(tmp_path / "tune_other.json"), "--out", str(tmp_path / "b2.json")],
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "tuned another EAGLE head" in refused.stderr
    assert {r["method"] for r in board["records"]} == {"ar (device)", "greedy (device)", "eagle-chain (device)",
                                                        "eagle (device)", "ar (engine)", "greedy (engine)",
                                                        "eagle-chain (engine)", "ar (device, float32)",
                                                        "ar (engine, float32)"}
    float32 = {r["method"]: r for r in board["records"] if "float32" in r["method"]}
    assert float32["ar (device, float32)"]["new_token_ids"] == float32["ar (engine, float32)"]["new_token_ids"]
    engine = {r["method"]: r for r in board["records"] if "(engine)" in r["method"]}
    assert engine["greedy (engine)"]["gamma"] == board["gammas"]["greedy (device)"]
    assert all(len(r["new_token_ids"]) == 8 for r in board["records"])
    # sampled: the draft's chain is `sampling`, the tree samples by SpecInfer's walk, the engine samples too
    run("--part", "device-tune", "--temperature", "1", "--gammas", "2", "--trees", "3x2x4",
        "--out", str(tmp_path / "tune_sampled.json"))
    tune = json.loads((tmp_path / "tune_sampled.json").read_text())
    assert tune["temperature"] == 1 and [r["method"] for r in tune["results"]] == ["sampling (device)",
                                                                                   "eagle-chain (device)",
                                                                                   "eagle (device)"]
    run("--part", "device-board", "--temperature", "1", "--repeats", "1",
        "--tuned", str(tmp_path / "tune_sampled.json"), "--out", str(tmp_path / "board_sampled.json"))
    board = json.loads((tmp_path / "board_sampled.json").read_text())
    assert {r["method"] for r in board["records"]} == {"ar (device)", "sampling (device)", "eagle-chain (device)",
                                                        "eagle (device)", "ar (engine)", "sampling (engine)",
                                                        "eagle-chain (engine)"}
    assert board["temperature"] == 1 and not any("same_as_device_ar" in r for r in board["records"])


def test_the_triton_attention_gives_the_same_tokens():
    """attention="triton": the target's pass through notebook 08's kernel (the prefix read unmasked, the rows' block
    mask), in the chain, the draft's chain sampled (draw for draw) and the tree, where a small vocabulary makes whole
    paths accepted: the same tokens as the same loop on SDPA (float32). On the CPU the kernel runs in Triton's
    interpreter; on a GPU the CUDA-only test records it."""
    from specdec_utils.core import tree_attention
    from specdec_utils.core.device_loop import DeviceTreeLoop
    if not tree_attention.AVAILABLE:
        pytest.skip(tree_attention.WHY)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # (the kernels run where the tensors are)
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.02, seed=1).to(device)
    head = random_eagle_head(target, 2)  # made on the CPU, then moved with the target
    target, head = target.to(device), head.to(device)
    ids = random_prompt(9, seed=6).to(device)
    reference = generate(target, ids, 30, method="ar").new_token_ids
    for name, loop in {"ar": DeviceLoop(target, gamma=0, attention="triton"),
                       "greedy 4": DeviceLoop(target, draft=draft, gamma=4, attention="triton"),
                       "eagle-chain 3": DeviceLoop(target, head=head, gamma=3, attention="triton")}.items():
        assert loop.generate(ids, 30).new_token_ids == reference, name
    sampled = [DeviceLoop(target, draft=draft, gamma=3, temperature=1.0, attention=attention)
               .generate(ids, 30, generator=torch.Generator().manual_seed(3)) for attention in ("sdpa", "triton")]
    assert sampled[0].new_token_ids == sampled[1].new_token_ids and sampled[1].tokens_per_round > 1.5
    small = random_model("tiny-llama", seed=4, vocab=6)
    small_head = random_eagle_head(small, 5)
    small, small_head = small.to(device), small_head.to(device)
    ids = random_prompt(6, seed=1, vocab=6).to(device)
    out = DeviceTreeLoop(small, small_head, depth=5, topk=3, nodes=30, attention="triton").generate(ids, 60)
    assert out.new_token_ids == generate(small, ids, 60, method="ar").new_token_ids
    assert max(out.accepted_per_round) >= 3
    with pytest.raises(ValueError, match="attention must be 'sdpa'"):
        DeviceLoop(target, gamma=0, attention="flash")
    # the benchmark's `--attention both`: every loop twice, the kernel's labelled
    from specdec_lab.tree_graph_bench import _device_loops
    loops = _device_loops(target, draft, head, 64, False, {"greedy": 2, "eagle-chain": 2, "eagle": (2, 2, 3)},
                          attentions=("sdpa", "triton"))
    assert {k: v.attention for k, v in loops.items()} == {
        "ar (device)": "sdpa", "greedy (device)": "sdpa", "eagle-chain (device)": "sdpa", "eagle (device)": "sdpa",
        "ar (device, triton)": "triton", "greedy (device, triton)": "triton", "eagle-chain (device, triton)": "triton",
        "eagle (device, triton)": "triton"}


def test_top_k_rows_is_topk():
    """The tree's top-k (k argmax passes, no radix select) gives torch.topk's values and indices; a tie goes to the
    lower index, and the k indices are distinct even where a row holds -inf."""
    from specdec_utils.core.device_loop import top_k_rows
    generator = torch.Generator().manual_seed(0)
    for shape in ((9,), (3, 8192), (4, 7)):
        for k in (1, 2, 3, 4):
            x = torch.randn(*shape, generator=generator)
            values, indices = top_k_rows(x, k)
            expected = x.topk(k)
            assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices), (shape, k)
    values, indices = top_k_rows(torch.tensor([1.0, 3.0, 3.0, -float("inf"), -float("inf")]), 5)
    assert indices.tolist() == [1, 2, 0, 3, 4] and values[:3].tolist() == [3.0, 3.0, 1.0]
    assert top_k_rows(torch.full((2, 4), -float("inf")), 3)[1].tolist() == [[0, 1, 2]] * 2


def test_the_device_tree_gives_the_target_alones_tokens():
    from specdec_utils.core.device_loop import DeviceTreeLoop
    target = random_model("tiny-llama", seed=0)
    head = random_eagle_head(target, 2)
    for seed, length in ((5, 2), (6, 9), (7, 17)):
        ids = random_prompt(length, seed=seed)
        reference = generate(target, ids, 40, method="ar").new_token_ids
        for depth, topk, nodes in ((1, 1, 1), (3, 2, 5), (4, 3, 12), (6, 4, 24), (3, 4, 4 + 2 * 16), (6, 2, 3),
                                   (4, 1, 4), (5, 1, 2)):
            loop = DeviceTreeLoop(target, head, depth=depth, topk=topk, nodes=nodes)
            assert loop.generate(ids, 40).new_token_ids == reference, (seed, depth, topk, nodes)


def test_a_tree_holding_every_token_accepts_a_whole_level_each_round():
    """With topk = the vocabulary, depth 2 and every candidate kept, the tree holds every token at depth 1 and every
    pair below it: the target's next two tokens are always in it, so every round accepts exactly 2."""
    from specdec_utils.core.device_loop import DeviceTreeLoop
    target = random_model("tiny-llama", seed=1, vocab=6)
    head = random_eagle_head(target, 3)
    ids = random_prompt(7, seed=2, vocab=6)
    loop = DeviceTreeLoop(target, head, depth=2, topk=6, nodes=6 + 36)
    out = loop.generate(ids, 30)
    assert out.new_token_ids == generate(target, ids, 30, method="ar").new_token_ids
    assert out.accepted_per_round == [2] * 10
    with pytest.raises(ValueError, match="nodes must be at most"):
        DeviceTreeLoop(target, head, depth=2, topk=6, nodes=43)
    with pytest.raises(ValueError, match="topk must be at most"):
        DeviceTreeLoop(target, head, depth=2, topk=7, nodes=3)


def test_deep_acceptance_in_the_device_tree():
    """A small vocabulary makes a random head right often, so whole paths of several nodes are accepted: the target
    must see each node's ancestors (its mask) and the accepted path's keys and values must move into place."""
    from specdec_utils.core.device_loop import DeviceTreeLoop
    target = random_model("tiny-llama", seed=4, vocab=6)
    head = random_eagle_head(target, 5)
    deepest = 0
    for seed in (1, 2, 3):
        ids = random_prompt(6, seed=seed, vocab=6)
        loop = DeviceTreeLoop(target, head, depth=5, topk=3, nodes=30)
        out = loop.generate(ids, 60)
        assert out.new_token_ids == generate(target, ids, 60, method="ar").new_token_ids
        deepest = max(deepest, max(out.accepted_per_round))
        # the committed part of the target's cache equals a fresh prefill of the same tokens
        L = int(loop.L)
        fresh = DeviceLoop(target, gamma=0)
        fresh._begin(loop.tokens[:L].clone())
        for mine, theirs in ((loop.target.keys, fresh.target.keys), (loop.target.values, fresh.target.values)):
            torch.testing.assert_close(mine[..., :L - 1, :], theirs[..., :L - 1, :], atol=1e-5, rtol=1e-4)
    assert deepest >= 3


def test_the_device_tree_scores_every_candidate_by_its_own_path():
    """Each candidate's score is the head's log-probability of its path, drafted as a chain through its ancestors
    alone (a reference written here, one node at a time): what the frontier's masks must give."""
    from specdec_utils.core.device_loop import DeviceTreeLoop
    target = random_model("tiny-llama", seed=0)
    head = random_eagle_head(target, 2)
    ids = random_prompt(9, seed=1)[0]
    loop = DeviceTreeLoop(target, head, depth=4, topk=3, nodes=10)
    with torch.no_grad():
        loop._begin(ids)
        tokens, scores, parents, depths = loop._grow(loop.L)
        chain = DeviceLoop(target, head=head, gamma=1)
        L = int(loop.L)
        for i in range(len(tokens)):
            path, j = [], i
            while j >= 0:
                path.append(j)
                j = int(parents[j])
            path.reverse()
            assert len(path) == int(depths[i])
            chain._begin(ids)
            h, logits, total = chain.h0, chain.logits0, 0.0
            for step, j in enumerate(path):
                total += float(torch.log_softmax(logits[0].float(), -1)[tokens[j]])
                if step + 1 < len(path):  # the entry (h, token) at position L - 1 + step, seeing only its own path
                    h, logits = chain._head_step(h, tokens[j:j + 1], torch.tensor([L - 1 + step]), own=True)
            assert abs(total - float(scores[i])) < 1e-4, (i, path)


def test_a_round_never_waits_for_the_host():
    """A CUDA graph cannot record an operation that reads a value back to the host (`.item()`, indexing with a 0-dim
    tensor, boolean masks): one round of every loop, watched op by op, must use none."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from specdec_utils.core.device_loop import DeviceTreeLoop
    host_reads = {torch.ops.aten._local_scalar_dense, torch.ops.aten.nonzero, torch.ops.aten.masked_select}

    class NoHostReads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            assert func.overloadpacket not in host_reads, f"{func} reads a value back to the host"
            if func.overloadpacket in (torch.ops.aten.index, torch.ops.aten.index_put, torch.ops.aten.index_put_):
                masks = [i for i in args[1] if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
                assert not masks, f"{func} with a boolean mask (its shape depends on the values)"
            return func(*args, **(kwargs or {}))

    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.02, seed=1)
    head = random_eagle_head(target, 2)
    ids = random_prompt(9, seed=3)[0]
    sampled = {"temperature": 0.8, "top_k": 50, "top_p": 0.9}
    for loop in (DeviceLoop(target, gamma=0), DeviceLoop(target, draft=draft, gamma=3),
                 DeviceLoop(target, head=head, gamma=3), DeviceTreeLoop(target, head, depth=4, topk=3, nodes=10),
                 DeviceLoop(target, gamma=0, **sampled), DeviceLoop(target, draft=draft, gamma=3, **sampled),
                 DeviceLoop(target, head=random_eagle_head(target, 3, vocab_ids=torch.arange(3, 200)), gamma=3,
                            **sampled)):
        with torch.no_grad():
            loop._begin(ids)
            with NoHostReads():
                loop._round()
                loop._round()


def test_the_device_tree_keeps_the_heads_cache_in_step():
    """After a generation, the head's committed entries and its output for the newest one equal a fresh start on the
    same tokens (the catch-up from the accepted path's features is right)."""
    from specdec_utils.core.device_loop import DeviceTreeLoop
    target = random_model("tiny-llama", seed=4, vocab=6)
    head = random_eagle_head(target, 5)
    loop = DeviceTreeLoop(target, head, depth=5, topk=3, nodes=30)
    loop.generate(random_prompt(6, seed=1, vocab=6), 40)
    L = int(loop.L)
    fresh = DeviceTreeLoop(target, head, depth=5, topk=3, nodes=30)
    with torch.no_grad():
        fresh._begin(loop.tokens[:L].clone())
    for mine, theirs in ((loop.head_k, fresh.head_k), (loop.head_v, fresh.head_v)):
        torch.testing.assert_close(mine[:, :L - 1], theirs[:, :L - 1], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(loop.logits0, fresh.logits0, atol=1e-4, rtol=1e-4)


def test_the_sampled_round_compiled_draws_what_the_op_by_op_round_draws():
    """compile="round" with sampling (warping, the inverse CDF, the residual) traced whole: with the same generator
    it draws the same tokens as the round run op by op (float32: a uniform would have to fall within rounding of a
    boundary of the cumulative distribution to differ)."""
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.3, seed=1)
    ids = random_prompt(9, seed=4)
    outs = [DeviceLoop(target, draft=draft, gamma=2, temperature=0.9, top_p=0.95, compile=mode)
            .generate(ids, 30, generator=torch.Generator().manual_seed(7)) for mode in (False, "round")]
    assert outs[0].new_token_ids == outs[1].new_token_ids
    assert outs[0].accepted_per_round == outs[1].accepted_per_round


def test_the_whole_round_compiled_gives_the_target_alones_tokens():
    """compile="round": the round traced whole by torch.compile (fullgraph: any op it cannot trace fails here) and
    run compiled on the CPU, the tree's (the longest round) on two prompts."""
    target = random_model("tiny-llama", seed=0)
    head = random_eagle_head(target, 2)
    from specdec_utils.core.device_loop import DeviceTreeLoop
    loop = DeviceTreeLoop(target, head, depth=3, topk=2, nodes=5, compile="round")
    for seed in (5, 6):
        ids = random_prompt(13, seed=seed)
        assert loop.generate(ids, 30).new_token_ids == generate(target, ids, 30, method="ar").new_token_ids


# ---------------------------------------------------------------------------------------------- sampled rounds
@pytest.fixture(scope="module")
def four_tokens():
    """A 4-token target; a noisy copy as its draft (about half its drafts rejected: the residual is drawn often);
    an EAGLE head over tokens 0, 1 and 3 (q is 0 at token 2, which only the residual can supply); the target's exact
    distribution over 5 sampled tokens, plain and warped."""
    target = random_model("tiny-llama", seed=1, vocab=4)
    prompt = torch.tensor([[1, 3, 0]])
    models = {"draft": noisy_copy(target, noise=0.5, seed=3),
              "reduced head": random_eagle_head(target, 7, vocab_ids=torch.tensor([0, 1, 3]))}
    exact = {warp: exact_distribution(target, prompt, 5, Sampler(*warp)) for warp in ((1.0, 0, 1.0), (0.7, 0, 0.8))}
    return target, prompt, models, exact


SAMPLED_LOOPS = {  # name: (the loop's models and gamma, the warping: temperature, top_k, top_p)
    "sampling, gamma 3": ({"draft": "draft", "gamma": 3}, (1.0, 0, 1.0)),
    "sampling, gamma 2, T 0.7, top-p 0.8": ({"draft": "draft", "gamma": 2}, (0.7, 0, 0.8)),
    "eagle-chain, reduced vocabulary": ({"head": "reduced head", "gamma": 3}, (1.0, 0, 1.0)),
}


def sampled_loop(four_tokens, name):
    target, _, models, _ = four_tokens
    parts, (temperature, top_k, top_p) = SAMPLED_LOOPS[name]
    parts = {k: models[v] if isinstance(v, str) else v for k, v in parts.items()}
    return DeviceLoop(target, **{"gamma": 0, **parts}, temperature=temperature, top_k=top_k, top_p=top_p)


# 2,000 outputs of 5 tokens (1,024 possible) detect TV >= 0.10 of this target's distribution (90% power at alpha
# 1e-3; `exactness.min_detectable_tv`). The finer check is the next test's: draw for draw, the device loop writes the
# engine's tokens, whose sampled methods the engine's own exactness tests check.
@pytest.mark.stat
@pytest.mark.parametrize("name", list(SAMPLED_LOOPS))
def test_sampled_rounds_are_exact_over_whole_outputs(four_tokens, name):
    _, prompt, _, exact = four_tokens
    loop = sampled_loop(four_tokens, name)
    counts = sample_outputs(lambda g: loop.generate(prompt, 5, generator=g).new_token_ids, 2000)
    assert chi_square_p_value(counts, exact[SAMPLED_LOOPS[name][1]]) > 1e-3


@pytest.mark.stat
def test_planted_bug_the_token_after_a_rejection_drawn_from_p_fails(four_tokens, monkeypatch):
    """After a rejected draft the token must come from norm(max(0, p - q)); drawn from p itself (the residual
    forgotten), the tokens the draft favours come out too often, and the whole-output test sees it."""
    _, prompt, _, exact = four_tokens
    original = DeviceLoop._accept

    def residual_forgotten(self, drafts, q, target):
        n, _ = original(self, drafts, q, target)
        return n, draw(target.index_select(0, n.view(1)), self.uniforms[2 * self.gamma:])
    monkeypatch.setattr(DeviceLoop, "_accept", residual_forgotten)
    loop = sampled_loop(four_tokens, "sampling, gamma 3")
    counts = sample_outputs(lambda g: loop.generate(prompt, 5, generator=g).new_token_ids, 1000)  # (p ~ 1e-45 seen)
    assert chi_square_p_value(counts, exact[(1.0, 0, 1.0)]) < 1e-6


def test_a_sampled_loop_draws_what_the_engine_draws():
    """The round uses its uniforms in the engine's order (gamma for the drafts, then gamma + 1 for `rejection_sample`),
    so with the same seed, in float32, the sampled device loop writes the engine's own tokens, round for round, up to
    the engine's first round that drafts fewer than gamma (near the token budget). The engine's first EAGLE round
    drafts nothing (no features yet) and draws one uniform: the device loop starts after it."""
    target = random_model("tiny-llama", seed=0, vocab=16)  # a small vocabulary: drafts are kept often enough
    draft = noisy_copy(target, noise=0.3, seed=1)
    head = random_eagle_head(target, 2)

    def compared(rounds, gamma=4):  # the tokens of the engine's rounds before one drafts fewer than gamma
        k = next((i for i, r in enumerate(rounds) if r.drafted < gamma), len(rounds))
        return sum(r.accepted + 1 for r in rounds[:k])
    for seed in range(4):
        ids = random_prompt(9, seed=seed, vocab=16)
        engine = generate(target, ids, 40, method="sampling", draft=draft, gamma=4, temperature=1.0,
                          generator=torch.Generator().manual_seed(seed))
        loop = DeviceLoop(target, draft=draft, gamma=4, temperature=1.0)
        n = compared(engine.rounds)
        assert n >= 20 and loop.generate(ids, 40, generator=torch.Generator().manual_seed(seed)).new_token_ids[:n] \
            == engine.new_token_ids[:n], seed
        engine = generate(target, ids, 40, method="eagle-chain", eagle=head, gamma=4, temperature=1.0,
                          generator=torch.Generator().manual_seed(seed))
        generator = torch.Generator().manual_seed(seed)
        torch.rand(1, generator=generator, dtype=torch.float64)  # the engine's first round: no drafts, one draw
        first = torch.tensor([engine.new_token_ids[:1]])
        n = compared(engine.rounds[1:])
        got = DeviceLoop(target, head=head, gamma=4, temperature=1.0).generate(torch.cat([ids, first], 1), 39,
                                                                               generator=generator)
        assert n >= 20 and got.new_token_ids[:n] == engine.new_token_ids[1:1 + n], seed


@pytest.mark.stat
@pytest.mark.parametrize("bug", [False, True])
def test_a_sampled_device_tree_is_exact_over_whole_outputs_and_a_planted_bug_fails(four_tokens, monkeypatch, bug):
    """The device tree's SpecInfer walk (`sampling.accept_tree_sampled`, the head's children one-hot) writes the
    target's exact distribution over 5 tokens; with the residual forgotten after a rejection (the rejected child's
    token drawn again from r itself) the same test fails."""
    target, prompt, _, exact = four_tokens
    if bug:
        from specdec_utils.core import sampling
        monkeypatch.setattr(sampling, "residual", lambda rest, q_row: rest)
    loop = DeviceTreeLoop(target, random_eagle_head(target, 7), depth=2, topk=2, nodes=4, temperature=1.0)
    draws = 600 if bug else 2000  # (the bug's p: about 1e-18)
    counts = sample_outputs(lambda g: loop.generate(prompt, 5, generator=g).new_token_ids, draws)
    p = chi_square_p_value(counts, exact[(1.0, 0, 1.0)])
    assert p < 1e-6 if bug else p > 1e-3


def test_a_sampled_device_tree_draws_what_the_engine_draws():
    """The tree's walk reads one uniform per node it tries and one for the token after, so the round is handed
    nodes + 1 and the generator is left as many draws on as the round used: with the same seed the device tree writes
    the engine's sampled EAGLE tokens (the engine's first round drafts nothing and draws one uniform: the device tree
    starts after it), up to the engine's first round whose tree is smaller than the device's."""
    target = random_model("tiny-llama", seed=0, vocab=16)
    head = random_eagle_head(target, 2)
    loop = DeviceTreeLoop(target, head, depth=4, topk=3, nodes=10, temperature=1.0)
    kept = 0
    for seed in range(3):
        ids = random_prompt(9, seed=seed, vocab=16)
        engine = generate(target, ids, 40, method="eagle", eagle=head, gamma=4, temperature=1.0,
                          params={"width": 3, "tree_nodes": 10}, generator=torch.Generator().manual_seed(seed))
        generator = torch.Generator().manual_seed(seed)
        torch.rand(1, generator=generator, dtype=torch.float64)
        rounds = engine.rounds[1:]
        n = sum(r.accepted + 1 for r in rounds[:next((i for i, r in enumerate(rounds) if r.drafted < 10), len(rounds))])
        got = loop.generate(torch.cat([ids, torch.tensor([engine.new_token_ids[:1]])], 1), 39, generator=generator)
        assert n >= 20 and got.new_token_ids[:n] == engine.new_token_ids[1:1 + n], seed
        kept += sum(got.accepted_per_round)
    assert kept > 0  # some rounds keep nodes (and so use more of their draws than others)


def test_a_sampled_loop_repeats_its_draws_and_accepts_a_copy_of_the_target():
    """The same seed gives the same tokens (the draws come from the caller's generator); a draft equal to the target
    has every draft accepted (q = p: u q < p for every u < 1); other seeds give other texts."""
    target = random_model("tiny-llama", seed=3)
    ids = random_prompt(7, seed=1)
    loop = DeviceLoop(target, draft=copy.deepcopy(target), gamma=3, temperature=1.0)
    runs = [loop.generate(ids, 40, generator=torch.Generator().manual_seed(seed)) for seed in (1, 1, 2)]
    assert runs[0].new_token_ids == runs[1].new_token_ids != runs[2].new_token_ids
    assert all(run.accepted_per_round == [3] * 10 for run in runs)


def test_sampling_refuses_what_it_cannot_run():
    target = tiny_model("tiny-llama", vocab_size=64)
    for options, message in (({"temperature": -1.0}, "temperature must be"),
                             ({"temperature": 1e-9}, "temperature must"),
                             ({"temperature": 1.0, "top_p": 0.0}, "top_p must be"),
                             ({"temperature": 1.0, "top_k": -2}, "top_k must be")):
        with pytest.raises(ValueError, match=message):
            DeviceLoop(target, gamma=0, **options)
    with pytest.raises(ValueError, match="temperature must be"):
        DeviceTreeLoop(target, eagle.eagle_head_for(target), depth=2, topk=2, nodes=3, temperature=-1.0)
    with pytest.raises(ValueError, match="generator must be"):
        DeviceLoop(target, gamma=0, temperature=1.0).generate(torch.tensor([[5, 6]]), 3, generator=7)


def test_the_round_profile_reads_its_loop_specs():
    """`tools.round_profile` (GPU only) builds each loop from KIND@COMPILE[@ATTENTION]; a bad spec gets one line."""
    from specdec_lab.round_profile import build
    target = random_model("tiny-llama", seed=0)
    head = random_eagle_head(target, 2)
    tree = build("tree3x2x4@none@triton", target, head, 64)
    assert (tree.gamma, tree.topk, tree.nodes, tree.attention, tree.compiled) == (3, 2, 4, "triton", False)
    assert build("chain5@none", target, head, 64).gamma == 5 and build("ar@none", target, head, 64).gamma == 0
    for bad in ("tree5x3x10", "chain@round", "star@round", "ar@fast"):
        with pytest.raises(ValueError, match="a loop"):
            build(bad, target, head, 64)


@pytest.mark.slow  # the real target
def test_the_gpu_benchmark_runs_a_block_drafter_beside_the_others(tmp_path):
    """`--block`: the block drafter is one more device loop, tuned alone (the chains switched off with gamma 0; no
    gamma past its block) and run in the board at the tuned gamma, token for token the target alone's."""
    import json
    import subprocess
    import sys

    from specdec_utils.core.block import block_drafter_for
    from specdec_utils.models import load_model
    target, _ = load_model("smollm2-135m", device="cpu", dtype=torch.float32)
    block_drafter_for(target, block_size=4, vocab_ids=torch.arange(8192), markov_rank=4).save(tmp_path / "drafter")

    def run(*args):
        done = subprocess.run([sys.executable, "-m", "specdec_lab.tree_graph_bench", "--device", "cpu",
                               "--prompts", "1", "--max-new-tokens", "8", "--block", str(tmp_path / "drafter"),
                               *args], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    run("--part", "device-tune", "--gammas", "2,3,4", "--gamma-greedy", "0", "--gamma-eagle", "0",
        "--out", str(tmp_path / "tune.json"))
    tune = json.loads((tmp_path / "tune.json").read_text())
    assert [(r["method"], r["gamma"]) for r in tune["results"]] == [("block (device)", 2), ("block (device)", 3)]
    run("--part", "device-board", "--repeats", "1", "--tuned", str(tmp_path / "tune.json"), "--tree", "",
        "--out", str(tmp_path / "board.json"))
    board = json.loads((tmp_path / "board.json").read_text())
    assert board["gammas"]["block (device)"] == tune["best"]["block (device)"]
    tokens = {r["method"]: r["new_token_ids"] for r in board["records"]}
    assert tokens["block (device)"] == tokens["ar (device)"] and len(tokens["block (device)"]) == 8
