"""Block drafting (core/block.py): the training forward (many blocks per row, each reading the context before its
anchor) equals the decode-time forward; greedy `block` equals `ar` (full and reduced vocabulary, with and without the
Markov head, EOS and budget cuts); sampled `block` is exact over whole outputs, and a planted bug (drafts verified
against the wrong q) fails; one drafter pass per round; the trainer's tau is the engine's; bad arguments fail in
one line."""
import pytest
import torch
from test_eagle import tiny_target

from specdec_utils import generate
from specdec_utils.core import block
from specdec_utils.core.engine import Sampler
from specdec_utils.core.hidden import capture_hidden
from specdec_utils.exactness import chi_square_p_value, exact_distribution, sample_outputs

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread is fastest (see conftest)


def random_drafter(target, seed: int = 0, **options):
    drafter = block.block_drafter_for(target, seed=seed, **options)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # an untrained drafter is near-uniform: make every part matter
        for p in drafter.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))
    return drafter.eval()


def greedy_setup(new_tokens: int):
    """(target, drafter with block_size 5, prompt, the target's greedy continuation, prompt + continuation)."""
    target = tiny_target(64, 2)
    prompt = torch.tensor([[5, 9, 11, 4]])
    continuation = generate(target, prompt, new_tokens, method="ar").new_token_ids
    return (target, random_drafter(target, 1, block_size=5), prompt, continuation,
            torch.cat([prompt[0], torch.tensor(continuation)]))


def oracle_forward(full):
    """A BlockDrafter.forward whose slots are the target's own greedy tokens `full` (the anchor's followers)."""
    def oracle(self, context, anchors, starts, context_mask):
        m = int(starts[0, 0])
        future = full[m + 1:m + self.block_size]
        logits = torch.full((1, 1, self.block_size - 1, 64), -10.0)
        logits[0, 0, torch.arange(len(future)), future] = 10.0
        return logits
    return oracle


def fused_features(target, drafter, full):
    """The drafter's fused context of every position of `full`, from one fresh pass of the target."""
    with torch.no_grad(), capture_hidden(target, drafter.target_hidden) as captured:
        target(input_ids=full[None])
        return drafter.fuse(captured[0])[0]


def test_training_blocks_equal_one_block_at_decode_time():
    target = tiny_target(64, 1)
    drafter = random_drafter(target, 3, block_size=4, layers=2)
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture_hidden(target, drafter.target_hidden) as captured:
        target(input_ids=ids)
    context = drafter.fuse(captured[0])  # [2, 12, H]
    starts = torch.tensor([[2, 5, 9], [1, 6, 11]])
    anchors = ids.gather(1, starts)
    with torch.no_grad():
        together = drafter(context, anchors, starts, block.block_mask(starts, 12))
        for row in range(2):
            for a in range(3):
                s = int(starts[row, a])  # decode time: the context is exactly the positions before the anchor
                alone = drafter(context[row:row + 1, :s], anchors[row:row + 1, a:a + 1], starts[row:row + 1, a:a + 1],
                                torch.ones(1, 1, s, dtype=torch.bool))
                assert torch.allclose(together[row, a], alone[0, 0], atol=1e-5), (row, a)
    # the block attends inside itself both ways: changing the anchor changes every slot's logits
    everything = torch.ones(1, 1, 5, dtype=torch.bool)
    other = drafter(context[:1, :5], (anchors[:1, 1:2] + 1) % 64, starts[:1, 1:2], everything)
    assert not torch.allclose(other[0, 0], together[0, 1], atol=1e-4)


@pytest.mark.parametrize("options", [{}, {"vocab_ids": torch.arange(3, 40)},
                                     {"vocab_ids": torch.arange(3, 40), "markov_rank": 4}],
                         ids=["full", "reduced", "markov"])
def test_greedy_block_equals_ar(options):
    target = tiny_target(64, 2)
    drafter = random_drafter(target, 1, block_size=5, **options)
    ids = torch.tensor([[5, 9, 11, 4]])
    ref = generate(target, ids, 30, method="ar")
    for gamma in (1, 4):
        out = generate(target, ids, 30, method="block", draft=drafter, gamma=gamma)
        assert out.new_token_ids == ref.new_token_ids
        assert out.draft_calls == sum(r.drafted > 0 for r in out.rounds)  # one drafter pass per drafting round
        assert all(r.drafted <= gamma for r in out.rounds)
    eos = ref.new_token_ids[7]
    expected = generate(target, ids, 30, method="ar", eos_token_id=eos).new_token_ids
    for budget in (30, 2, 1):
        out = generate(target, ids, budget, method="block", draft=drafter, eos_token_id=eos)
        assert out.new_token_ids == expected[:budget]


def test_greedy_block_confidence_equals_ar_and_verifies_what_the_drafter_trusts():
    """The confidence-chosen length: greedy output equals `ar` at every threshold; threshold 0 drafts what `block`
    drafts, threshold 1 one token a round; in between, a round stops exactly where the drafter's probability of the
    prefix times the next slot's top probability falls below the threshold."""
    target = tiny_target(64, 2)
    drafter = random_drafter(target, 1, block_size=6, vocab_ids=torch.arange(3, 40), markov_rank=4)
    ids = torch.tensor([[5, 9, 11, 4]])
    ref = generate(target, ids, 30, method="ar").new_token_ids
    fixed = generate(target, ids, 30, method="block", draft=drafter)
    drafted = {}
    for threshold in (0.0, 0.005, 0.3, 1.0):  # (this random drafter is near-uniform: its reach falls fast)
        out = generate(target, ids, 30, method="block-confidence", draft=drafter, params={"threshold": threshold})
        assert out.new_token_ids == ref
        drafted[threshold] = [r.drafted for r in out.rounds if r.drafted]
    assert drafted[0.0] == [r.drafted for r in fixed.rounds if r.drafted]
    assert set(drafted[1.0]) == {1}
    rounds = generate(target, ids, 30, method="block-confidence", draft=drafter, params={"threshold": 0.005}).rounds
    lengths = {r.drafted for r in rounds if r.stop == "confidence"}
    assert len(lengths) >= 2 and max(lengths) < 5  # the rule chose several lengths below gamma (not the budget)


def test_block_confidence_stops_where_the_reach_falls_below_the_threshold():
    from specdec_utils.core.engine import DraftStep
    policy = block.BlockConfidence(gamma=5, threshold=0.25)
    policy.round_gamma()
    first = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    step = DraftStep(0, 0, first, 0, None)
    assert not policy.stop_before(step) and not policy.stop_after(step)  # the first slot always joins
    assert abs(policy.reach - 0.6) < 1e-6
    assert not policy.stop_before(DraftStep(1, 1, torch.log(torch.tensor([0.5, 0.4, 0.1])), 0, None))  # 0.30
    assert policy.stop_before(DraftStep(1, 1, torch.log(torch.tensor([0.4, 0.35, 0.25])), 0, None))  # 0.24
    policy.round_gamma()
    assert policy.reach == 1.0
    assert block.threshold_from_costs(0.0, 30.0, 2.0) == 0.0  # free verification: verify the whole block
    assert abs(block.threshold_from_costs(3.0, 40.0, 2.0) - 0.15) < 1e-12
    assert block.threshold_from_costs(30.0, 40.0, 2.0) == 1.0
    with pytest.raises(ValueError, match="round_cost must be a time > 0"):
        block.threshold_from_costs(1.0, 0.0, 2.0)


def test_the_proposer_reads_the_targets_features_of_every_committed_position(monkeypatch):
    """Each round's context is the target's fused features of exactly the positions before the anchor, as one pass
    over the whole output computes them (a stale, shifted or missing row would keep the output exact and only
    lose acceptance: this is the check that sees it)."""
    target = tiny_target(64, 2)
    drafter = random_drafter(target, 1, block_size=4, vocab_ids=torch.arange(3, 40), markov_rank=2)
    prompt, seen = torch.tensor([[5, 9, 11, 4]]), []
    real = block.BlockDrafter.forward

    def recording(self, context, anchors, starts, context_mask):
        seen.append((context[0].clone(), int(starts[0, 0]), int(anchors[0, 0])))
        return real(self, context, anchors, starts, context_mask)
    monkeypatch.setattr(block.BlockDrafter, "forward", recording)
    out = generate(target, prompt, 24, method="block", draft=drafter, gamma=3)
    full = torch.cat([prompt[0], torch.tensor(out.new_token_ids)])
    fused = fused_features(target, drafter, full)
    assert len(seen) == out.draft_calls >= len(out.rounds) - 2  # one pass per drafting round (not the prefill's,
    # nor a last round with no room left)
    for context, m, anchor in seen:
        assert context.shape[0] == m and anchor == int(full[m])
        assert torch.allclose(context, fused[:m], atol=1e-4)


def test_a_drafter_that_copies_the_target_is_always_accepted(monkeypatch):
    """Proposals the target agrees with are all kept: a drafter whose slots are the target's own greedy tokens
    gives gamma + 1 tokens per round (the plumbing of anchors, positions and rollback, checked end to end)."""
    target, drafter, ids, ref, full = greedy_setup(24)

    monkeypatch.setattr(block.BlockDrafter, "forward", oracle_forward(full))
    out = generate(target, ids, 24, method="block", draft=drafter, gamma=4)
    assert out.new_token_ids == ref
    assert [r.accepted for r in out.rounds[1:-1]] == [4] * (len(out.rounds) - 2)


@pytest.fixture(scope="module")
def small_vocab():
    target = tiny_target(4, 1)
    drafter = random_drafter(target, 5, block_size=4)
    prompt = torch.tensor([[1, 3, 0]])
    return target, drafter, prompt, exact_distribution(target, prompt, 5, Sampler(1.0))


# 3,000 outputs of 5 tokens (1,024 possible) detect TV >= 0.071 (90% power at alpha 1e-3, worst direction;
# `exactness.min_detectable_tv`, as for the other methods)
@pytest.mark.stat
@pytest.mark.parametrize("options", [{"vocab_ids": torch.tensor([0, 1, 3])},
                                     {"vocab_ids": torch.tensor([0, 1, 3]), "markov_rank": 2}],
                         ids=["reduced", "markov"])
def test_sampled_block_is_exact_over_whole_outputs(small_vocab, options):
    """q is zero outside the draft vocabulary (tokens 0, 1, 3): the residual must supply token 2; with the Markov head
    each slot's q also depends on the token drawn before it. (The planted bug below runs the full vocabulary.)"""
    target, _, prompt, exact = small_vocab
    drafter = random_drafter(target, 7, block_size=4, **options)
    counts = sample_outputs(lambda g: generate(target, prompt, 5, method="block", draft=drafter, gamma=3,
                                               temperature=1.0, generator=g).new_token_ids, 3000)
    assert chi_square_p_value(counts, exact) > 1e-3


@pytest.mark.stat
def test_sampled_block_confidence_is_exact_over_whole_outputs(small_vocab):
    """The confidence rule decides before each slot from its distribution, after it from the drawn token: the
    output stays the target's distribution (rounds stop at different lengths, the fixed-length test cannot see
    that path)."""
    target, _, prompt, exact = small_vocab
    drafter = random_drafter(target, 7, block_size=4, vocab_ids=torch.tensor([0, 1, 3]), markov_rank=2)
    stops = []

    def one(g):
        out = generate(target, prompt, 5, method="block-confidence", draft=drafter, gamma=3, params={"threshold": 0.2},
                       temperature=1.0, generator=g)
        stops.extend(r.stop for r in out.rounds)
        return out.new_token_ids
    counts = sample_outputs(one, 3000)
    assert chi_square_p_value(counts, exact) > 1e-3
    assert stops.count("confidence") > 300 and stops.count("gamma") > 300  # rounds of both lengths were drawn


@pytest.mark.stat
def test_planted_bug_slots_verified_against_the_wrong_q_fails(small_vocab, monkeypatch):
    """The block's tokens drawn from each slot's q but verified as if drawn from the uniform distribution."""
    target, drafter, prompt, exact = small_vocab
    original = block.BlockProposer.propose

    def without_q(self, *args):
        proposal = original(self, *args)
        if proposal.probs is not None:
            proposal.probs = torch.full_like(proposal.probs, 0.25)
        return proposal
    monkeypatch.setattr(block.BlockProposer, "propose", without_q)
    counts = sample_outputs(lambda g: generate(target, prompt, 5, method="block", draft=drafter, gamma=3,
                                               temperature=1.0, generator=g).new_token_ids, 3000)
    assert chi_square_p_value(counts, exact) < 1e-6


def test_bad_arguments_fail_in_one_line():
    target = tiny_target(64, 1)
    with pytest.raises(ValueError, match="block_size must be an integer >= 2"):
        block.BlockDrafter(target, block_size=1)
    with pytest.raises(ValueError, match="markov_rank must be"):
        block.BlockDrafter(target, markov_rank=-1)
    with pytest.raises(ValueError, match="features must be"):
        block.BlockDrafter(target, features=(99,))
    with pytest.raises(ValueError, match="gamma must be at most 7"):
        generate(target, torch.tensor([[1, 2]]), 4, method="block", draft=block.block_drafter_for(target), gamma=9)
    with pytest.raises(ValueError, match="needs draft=... a block drafter"):
        generate(target, torch.tensor([[1, 2]]), 4, method="block", draft=target)


def test_the_trainer_lowers_the_block_loss_and_saves_what_it_measured(tmp_path):
    import json

    from specdec_lab import train_block, write_corpus
    corpus = tmp_path / "corpus.pt"
    assert write_corpus.main(["--target", "tiny-llama", "--device", "cpu", "--tokens", "300", "--batch", "8",
                              "--new-tokens", "24", "--out", str(corpus), "--mix", "docs=1"]) == 0
    assert train_block.main(["--corpus", str(corpus), "--target", "tiny-llama", "--device", "cpu", "--steps", "30",
                             "--batch-size", "4", "--max-len", "40", "--eval-prompts", "2", "--vocab-size", "200",
                             "--block-size", "4", "--lr", "3e-3", "--markov-rank", "4", "--out",
                             str(tmp_path / "d")]) == 0
    log = json.loads((tmp_path / "d" / "config.json").read_text())["log"]
    losses = [entry["loss"] for entry in log["train_log"]]
    assert losses[-1] < losses[0]  # it learns (a tiny random target: the loss falls fast)
    assert log["eval"]["prompts"] == 2 and log["eval"]["positions"] > 0 and "tau_gamma3" in log["eval"]
    with pytest.raises(ValueError, match="was trained for hidden size"):
        block.load_block(tmp_path / "d", tiny_target(64, 1))  # 64 tokens, not the trainer's tiny-llama vocabulary
    with pytest.raises(SystemExit):
        train_block.main(["--corpus", str(tmp_path / "missing.pt")])


def test_save_and_load_round_trip(tmp_path):
    target = tiny_target(64, 1)
    drafter = random_drafter(target, 2, block_size=5, layers=2, vocab_ids=torch.arange(5, 45), markov_rank=3)
    drafter.save(tmp_path / "d")
    loaded = block.load_block(tmp_path / "d", target)
    assert loaded.block_size == 5 and len(loaded.layers) == 2 and torch.equal(loaded.vocab_ids, drafter.vocab_ids)
    assert loaded.markov_rank == 3
    for (name, a), (_, b) in zip(drafter.state_dict().items(), loaded.state_dict().items()):
        assert torch.allclose(a.to(torch.bfloat16).float(), b.float()), name
    with pytest.raises(ValueError, match="no block drafter"):
        block.load_block(tmp_path / "nothing", target)


def test_the_trainers_tau_is_the_engines(monkeypatch):
    """`train_block.evaluate` counts rounds from one batched pass (teacher-forced, `theory.simulate_rounds`); the
    engine decodes. With a drafter right on some slots and wrong on others, the rounds are the same, the last ones
    included, where the engine's token budget cuts the drafts (no bonus token past the continuation's end)."""
    from specdec_lab import train_block
    from specdec_utils.theory import simulate_rounds
    target, drafter, prompt, _, full = greedy_setup(40)

    def sometimes_right(self, context, anchors, starts, context_mask):
        B, A = anchors.shape
        logits = torch.full((B, A, self.block_size - 1, 64), -10.0)
        for a in range(A):
            for i in range(self.block_size - 1):
                pos = int(starts[0, a]) + 1 + i
                right = int(full[pos]) if pos < len(full) else 0
                logits[0, a, i, right if pos % 3 else (right + 1) % 64] = 10.0
        return logits
    monkeypatch.setattr(block.BlockDrafter, "forward", sometimes_right)
    counted = simulate_rounds(train_block.block_matches(drafter, target, full[None], prompt.shape[1]), 4)
    decoded = generate(target, prompt, 40, method="block", draft=drafter, gamma=4).rounds[1:]  # [0]: the prefill
    assert len(counted) > 8 and [tuple(r) for r in counted] == [(r.drafted, r.accepted, r.new_tokens) for r in decoded]
    assert len({r.new_tokens for r in counted}) > 1  # the rounds differ: a real check, not all-rejected


# ------------------------------------------------------------------------------------------- on the device loop
@pytest.mark.parametrize("options", [{}, {"vocab_ids": torch.arange(3, 40), "markov_rank": 4}],
                         ids=["full", "markov"])
def test_the_device_loop_gives_the_target_alones_tokens(options):
    """The recorded round (op by op on the CPU), directly and through `generate(..., executor=DeviceExecutor())`:
    the target alone's tokens for several prompt lengths and gammas, one drafter pass a round."""
    from specdec_utils.core.device_loop import DeviceExecutor, DeviceLoop
    target = tiny_target(64, 2)
    drafter = random_drafter(target, 1, block_size=5, **options)
    executor = DeviceExecutor()
    for length in (2, 4, 9):
        ids = torch.tensor([[5, 9, 11, 4, 7, 1, 30, 2, 8][:length]])
        ref = generate(target, ids, 30, method="ar").new_token_ids
        for gamma in (1, 4):
            assert DeviceLoop(target, drafter=drafter, gamma=gamma).generate(ids, 30).new_token_ids == ref
            through = generate(target, ids, 30, method="block", draft=drafter, gamma=gamma, executor=executor)
            assert through.new_token_ids == ref and through.draft_calls == len(through.rounds)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_recorded_block_round_gives_the_target_alones_tokens():
    """On a GPU the round is recorded as a CUDA graph and replayed (each pass compiled, or the whole round): the
    target alone's tokens, with and without the Markov head, after a new gamma, and past a growth of the buffers."""
    from specdec_utils.core.device_loop import DeviceLoop
    target = tiny_target(64, 2)
    drafters = {"plain": random_drafter(target, 1, block_size=6),
                "markov": random_drafter(target, 2, block_size=6, vocab_ids=torch.arange(3, 40), markov_rank=4)}
    target = target.cuda()
    for name, drafter in drafters.items():
        drafter = drafter.cuda()
        for compile_mode in (False, True, "round"):
            loop = DeviceLoop(target, drafter=drafter, gamma=4, compile=compile_mode)
            for seed in (5, 6):
                ids = torch.tensor([[5, 9, 11, 4, 7, 1, 30, 2, 8][:4 + seed]]).cuda()
                reference = generate(target, ids, 40, method="ar").new_token_ids
                assert loop.generate(ids, 40).new_token_ids == reference, (name, compile_mode)
                assert loop.graph is not None
            loop.set_gamma(2)
            assert loop.generate(ids, 40).new_token_ids == reference, (name, compile_mode, "gamma 2")
            long_ids = torch.tensor([[3, 8, 5]]).cuda()
            assert loop.generate(long_ids, 400).new_token_ids == generate(target, long_ids, 400,
                                                                          method="ar").new_token_ids
        times = loop.anatomy(repeats=3)
        assert set(times) == {"round_ms", "draft_ms", "verify_ms"} and min(times.values()) > 0, (name, times)


def test_the_device_loop_reads_every_committed_positions_features_and_keeps_right_drafts(monkeypatch):
    """Each pass reads the target's fused features of exactly the positions before its anchor (as one fresh pass
    computes them; rows after it are masked out), and drafts the target agrees with are all kept: a drafter whose
    slots are the target's own greedy tokens gives gamma + 1 tokens a round."""
    from specdec_utils.core.device_loop import DeviceLoop
    target, drafter, ids, ref, full = greedy_setup(24)
    real, seen = block.BlockDrafter.forward, []

    def recording(self, context, anchors, starts, context_mask):
        m = int(starts[0, 0])
        seen.append((context[0, :m].clone(), int(context_mask[0, 0].sum()), m, int(anchors[0, 0])))
        return real(self, context, anchors, starts, context_mask)
    monkeypatch.setattr(block.BlockDrafter, "forward", recording)
    out = DeviceLoop(target, drafter=drafter, gamma=3).generate(ids, 24)
    assert out.new_token_ids == ref and len(seen) == len(out.rounds)
    fused = fused_features(target, drafter, full)
    for context, visible, m, anchor in seen:
        assert visible == m and anchor == int(full[m])
        assert torch.allclose(context, fused[:m], atol=1e-4)

    monkeypatch.setattr(block.BlockDrafter, "forward", oracle_forward(full))
    out = DeviceLoop(target, drafter=drafter, gamma=4).generate(ids, 24)
    assert out.new_token_ids == ref
    assert [r.accepted for r in out.rounds[:-1]] == [4] * (len(out.rounds) - 1)


def test_the_device_loop_feeds_each_slot_the_token_drafted_before_it(monkeypatch):
    """With a Markov head each slot's logits depend on the token before it: slot 0 reads the anchor, slot k the
    token drafted at slot k - 1 (greedy: the argmax of that slot's biased logits). The output stays the target's
    whatever the head reads, so this is the check that sees a wrong input."""
    from specdec_utils.core.device_loop import DeviceLoop
    target = tiny_target(64, 2)
    drafter = random_drafter(target, 1, block_size=5, vocab_ids=torch.arange(3, 40), markov_rank=4)
    real_forward, real_markov, passes = block.BlockDrafter.forward, block.BlockDrafter.markov, []

    def forward(self, context, anchors, starts, context_mask):
        logits = real_forward(self, context, anchors, starts, context_mask)
        passes.append({"anchor": int(anchors[0, 0]), "logits": logits[0, 0].clone(), "inputs": [], "biases": []})
        return logits

    def markov(self, previous):
        bias = real_markov(self, previous)
        passes[-1]["inputs"].append(int(previous.reshape(-1)[0]))
        passes[-1]["biases"].append(bias.reshape(-1, bias.shape[-1])[0].clone())
        return bias
    monkeypatch.setattr(block.BlockDrafter, "forward", forward)
    monkeypatch.setattr(block.BlockDrafter, "markov", markov)
    ids = torch.tensor([[5, 9, 11, 4]])
    assert DeviceLoop(target, drafter=drafter, gamma=4).generate(ids, 20).new_token_ids == \
        generate(target, ids, 20, method="ar").new_token_ids
    assert passes and all(len(p["inputs"]) == 4 for p in passes)
    for p in passes:
        assert p["inputs"][0] == p["anchor"]
        for k in range(3):
            drafted = int(drafter.vocab_ids[(p["logits"][k] + p["biases"][k]).argmax()])
            assert p["inputs"][k + 1] == drafted


def test_the_rotary_frequencies_stay_float32_on_the_drafters_device():
    """A buffer moves with the drafter (no host copy inside a recorded round) and is never rounded to its dtype."""
    target = tiny_target(64, 1)
    drafter = block.block_drafter_for(target)
    exact = drafter.inv_freq.clone()
    assert "inv_freq" in dict(drafter.named_buffers()) and "inv_freq" not in drafter.state_dict()
    drafter.to(torch.bfloat16)
    assert drafter.fc.weight.dtype == torch.bfloat16 and torch.equal(drafter.inv_freq, exact)


@pytest.mark.stat
def test_sampled_device_blocks_are_exact_over_whole_outputs(small_vocab):
    from specdec_utils.core.device_loop import DeviceLoop
    target, _, prompt, exact = small_vocab
    drafter = random_drafter(target, 7, block_size=4, vocab_ids=torch.tensor([0, 1, 3]), markov_rank=2)
    loop = DeviceLoop(target, drafter=drafter, gamma=3, temperature=1.0)
    counts = sample_outputs(lambda g: loop.generate(prompt, 5, generator=g).new_token_ids, 3000)
    assert chi_square_p_value(counts, exact) > 1e-3


def test_the_device_loop_refuses_a_block_it_cannot_hold():
    from specdec_utils.core.device_loop import DeviceExecutor, DeviceLoop
    target = tiny_target(64, 1)
    drafter = block.block_drafter_for(target, block_size=4)
    with pytest.raises(ValueError, match="gamma must be at most 3"):
        DeviceLoop(target, drafter=drafter, gamma=4)
    with pytest.raises(ValueError, match="not several"):
        DeviceLoop(target, head=drafter, drafter=drafter, gamma=2)
    with pytest.raises(ValueError, match="needs draft=... a block drafter"):
        generate(target, torch.tensor([[1, 2]]), 4, method="block", draft=target, executor=DeviceExecutor())
