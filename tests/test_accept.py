"""The math of a round, written once (`sampling.draw`, `accept_greedy`, `accept_sampled`): the engine calls these
functions eagerly and the device loop records the very same ones.

- `draw` keeps u * total below the total, so an extreme uniform never lands past the last token with mass (the
  engine's old inverse CDF returned index V there);
- a chain proposed deterministically (`Proposal.probs = None`, as a prompt-lookup proposer makes) is verified as a
  one-hot q when sampling: exact over whole outputs (enumerated), and the check fails on a planted bug that forgets
  to zero the rejected token (before, such a chain crashed the sampled verifier);
- the device loop's acceptance is these functions, not a copy.
"""
import inspect
from collections import Counter

import pytest
import torch

from specdec_utils.core import device_loop, sampling
from specdec_utils.core.engine import DraftModelProposer, Proposal, Sampler, decode
from specdec_utils.core.policies import DraftingPolicy
from specdec_utils.core.sampling import accept_greedy, accept_sampled, draw, rejection_sample
from specdec_utils.exactness import ToyLM, chi_square_p_value, exact_distribution, sample_outputs

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB, N_TOKENS, EOS, TRIALS, MIN_P_VALUE = 5, 3, 4, 3000, 1e-3


# ----------------------------------------------------------------------------------------------------- draw
def test_draw_never_lands_past_the_last_token_with_mass():
    """u * total can round up to the total (a uniform of 1.0 is the extreme case): the token drawn must still be
    one with mass, never index V or a zero-probability token at the end of the row."""
    probs = torch.tensor([[0.25, 0.75, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.5, 0.0, 0.0, 0.5]])
    top = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    assert draw(probs, top).tolist() == [1, 2, 3]
    below = torch.full((3,), 1 - 2.0 ** -53, dtype=torch.float64)
    assert draw(probs, below).tolist() == [1, 2, 3]
    assert draw(probs, torch.zeros(3, dtype=torch.float64)).tolist() == [0, 2, 0]  # empty slices are skipped


def test_draw_is_the_inverse_cdf_of_each_row():
    generator = torch.Generator().manual_seed(0)
    probs = torch.rand(64, 9, generator=generator) * (torch.rand(64, 9, generator=generator) > 0.3)
    probs[:, 0] += 1e-3  # every row has mass
    u = torch.rand(64, generator=generator, dtype=torch.float64)
    cdf = probs.double().cumsum(-1)
    expected = [int((cdf[i] <= u[i] * cdf[i, -1]).sum()) for i in range(64)]  # tokens whose slice ends below
    assert draw(probs, u).tolist() == expected
    assert all(probs[i, t] > 0 for i, t in enumerate(expected))


def test_sample_token_draws_through_draw_and_refuses_bad_rows():
    probs = torch.tensor([0.1, 0.0, 0.9])
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    tokens = [sampling.sample_token(probs, a) for _ in range(50)]
    assert tokens == draw(probs.expand(50, -1), torch.rand(50, generator=b, dtype=torch.float64)).tolist()
    for bad in (torch.tensor([0.5, -0.1]), torch.zeros(3), torch.tensor([float("inf"), 1.0])):
        with pytest.raises(ValueError, match="non-negative with a positive sum"):
            sampling.sample_token(bad)


# ----------------------------------------------------------------------------------------------- acceptance
def test_accept_greedy_is_the_leading_run_of_matches():
    generator = torch.Generator().manual_seed(1)
    for _ in range(200):
        k = int(torch.randint(0, 6, (), generator=generator))
        choice = torch.randint(0, 3, (k + 1,), generator=generator)
        drafts = torch.randint(0, 3, (k,), generator=generator)
        n, after = accept_greedy(drafts, choice)
        run = next((i for i in range(k) if drafts[i] != choice[i]), k)
        assert int(n) == run and after.tolist() == [int(choice[run])]


def _host_tree_walk(nodes, parents, q, p, generator):
    """SpecInfer's walk as a host loop drawing each uniform when it needs it: the reference for the tensor walk."""
    children = {-1: []}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i)
    node, path = -1, []
    while True:
        rest, kept = p[node + 1].double(), None
        for c in children.get(node, []):
            x = nodes[c]
            q_row = torch.zeros_like(rest).index_fill_(0, torch.tensor([x]), 1.0) if q is None else q[c].double()
            if float(torch.rand((), generator=generator, dtype=torch.float64)) * float(q_row[x]) < float(rest[x]):
                kept = c
                break
            rest = sampling.residual(rest, q_row)
        if kept is None:
            return path, int(draw(rest[None], torch.rand(1, generator=generator, dtype=torch.float64))[0])
        path.append(kept)
        node = kept


@pytest.mark.parametrize("deterministic", [False, True])
def test_the_tensor_tree_walk_equals_the_host_walk_and_reads_as_many_uniforms(deterministic):
    """`accept_tree_sampled` on random trees (sampled or one-hot children, vocabularies of 3 so rejections and
    residuals happen): the same path and token as the host walk from the same seed, and through `verify.exact_walk`
    the generator left where the host walk leaves it."""
    from specdec_utils.core import verify
    rng = torch.Generator().manual_seed(0)
    for trial in range(300):
        size = int(torch.randint(0, 8, (), generator=rng))
        parents = [int(torch.randint(-1, i, (), generator=rng)) for i in range(size)]
        q = None if deterministic else torch.softmax(2 * torch.randn(size, 3, generator=rng), -1)
        nodes = [int(torch.randint(0, 3, (), generator=rng)) if q is None else
                 int(torch.multinomial(q[i], 1, generator=rng)) for i in range(size)]
        p = torch.softmax(2 * torch.randn(size + 1, 3, generator=rng), -1)
        path, token = _host_tree_walk(nodes, parents, q, p, host := torch.Generator().manual_seed(trial))
        uniforms = torch.rand(size + 1, generator=torch.Generator().manual_seed(trial), dtype=torch.float64)
        ids, parent_ids = torch.tensor(nodes, dtype=torch.long), torch.tensor(parents, dtype=torch.long)
        on_path, tried, after = sampling.accept_tree_sampled(ids, parent_ids + 1, q, p, uniforms)
        assert on_path.nonzero().flatten().tolist() == path and int(after) == token
        walked = verify.exact_walk(torch.tensor(nodes, dtype=torch.long), torch.tensor(parents, dtype=torch.long), q,
                                   p, type("Rows", (), {"probs": staticmethod(lambda rows: rows)}),
                                   engine := torch.Generator().manual_seed(trial))
        assert walked.path == path and walked.tokens[-1] == token
        assert torch.equal(engine.get_state(), host.get_state())


def test_accept_sampled_with_one_hot_q_is_exact_for_one_round():
    """A deterministic draft x: kept with probability p(x) (u_0 * 1 < p(x)); after a rejection the token comes from
    p with x removed, so the first emitted token is distributed as p. Checked on grids of u_0 and of u_1."""
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]], dtype=torch.float64)
    grid = (torch.arange(4000, dtype=torch.float64) + 0.5) / 4000
    for x in range(3):
        drafts = torch.tensor([x])
        kept = sum(int(accept_sampled(drafts, None, p, torch.stack([u, u]))[0]) for u in grid[::4]) / 1000
        assert abs(kept - float(p[0, x])) < 2e-3
        after = Counter(int(accept_sampled(drafts, None, p, torch.stack([torch.tensor(0.999999, dtype=torch.float64),
                                                                           w]))[1]) for w in grid)
        rest = p[0].clone()
        rest[x] = 0
        assert after[x] == 0 and all(abs(after[t] / 4000 - float(rest[t] / rest.sum())) < 1e-3 for t in range(3))


def test_rejection_sample_takes_no_draft_probs_for_deterministic_drafts():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    out = rejection_sample(None, p, torch.tensor([1]), torch.Generator().manual_seed(0))
    assert out[0].item() == 1 and len(out) == 2  # p(x) = 1: always kept, then the bonus
    out = rejection_sample(None, p, torch.tensor([0]), torch.Generator().manual_seed(0))
    assert out.tolist() == [1]  # p(x) = 0: never kept; p with x removed is p


class GreedyChain(DraftModelProposer):
    """A chain chosen deterministically (the draft's argmax, probs None), proposed while the loop samples: what a
    prompt-lookup or n-gram proposer hands the verifier."""

    def propose(self, tokens, gamma, policy, sampler, generator, index):
        proposal = super().propose(tokens, gamma, policy, Sampler(0.0), generator, index)
        return Proposal(proposal.tokens, None, proposal.stop, proposal.draft_calls, proposal.vocab)


@pytest.fixture(scope="module")
def toy():
    # the draft is the target's own argmax (a second copy), so drafts are kept often but not always
    target, draft = ToyLM(VOCAB, seed=0, sharpness=1.0), ToyLM(VOCAB, seed=0, sharpness=1.0)
    prompt = torch.tensor([[1, 3, 2]])
    return target, draft, prompt, exact_distribution(target, prompt, N_TOKENS, Sampler(1.0), {EOS})


def deterministic_chain_outputs(toy):
    target, draft, prompt, _ = toy

    def run(generator):
        return decode(target, GreedyChain(draft), DraftingPolicy(2), prompt, N_TOKENS, Sampler(1.0), {EOS},
                      generator).new_token_ids

    return sample_outputs(run, TRIALS, seed=0)


@pytest.mark.stat
def test_a_deterministic_chain_is_sampled_exactly(toy):  # 3,000 outputs of up to 3 tokens: TV >= 0.049
    assert chi_square_p_value(deterministic_chain_outputs(toy), toy[3]) > MIN_P_VALUE


@pytest.mark.stat
def test_the_check_fails_when_the_rejected_deterministic_draft_is_not_removed(toy, monkeypatch):
    """Planted bug: after a rejection, draw from p itself (the rejected draft keeps its mass)."""
    monkeypatch.setattr(sampling, "_residual_distribution", lambda target_row, draft_row: target_row)
    assert chi_square_p_value(deterministic_chain_outputs(toy), toy[3]) < 1e-10


# ------------------------------------------------------------------------------------------- one copy of each
def test_the_device_loop_accepts_and_draws_with_the_engines_functions():
    assert device_loop.draw is draw and not hasattr(device_loop, "sample_rows")
    source = inspect.getsource(device_loop.DeviceLoop._accept)
    assert "accept_greedy(" in source and "accept_sampled(" in source and "cumprod" not in source


def test_the_argument_rules_are_written_once():
    """The engine's `check_arguments`, the device loops and `warp_logits` call `core.checks`' rules rather than keep a
    copy each (copies drifted apart: a temperature of 1e-9 or top_k=True was taken by one and refused by another)."""
    from specdec_utils.core import engine
    for function in (engine.check_arguments, sampling.warp_logits, device_loop.DeviceLoop.__init__):
        source = inspect.getsource(function)
        assert "check_sampling(" in source and "isfinite(" not in source and "isinstance(top" not in source, function
    for function in (engine.check_arguments, device_loop.DeviceLoop.generate):
        source = inspect.getsource(function)
        assert "check_count(\"max_new_tokens\"" in source and "check_prompt_ids(" in source, function


def test_the_device_loop_and_the_engine_return_one_result_type():
    """Same greedy tokens, same acceptance round by round, and the same counts in the same type (`GenerationResult`'s
    rule): in the last round, where the budget leaves 2 tokens, both keep one draft and the target's token; the device
    loop drafted 3 there (its rounds have one shape) and ran a prefill pass of its own."""
    import copy

    from specdec_utils.core.device_loop import DeviceLoop
    from specdec_utils.core.engine import GenerationResult
    from specdec_utils.core.methods import generate

    from conftest import random_model, random_prompt

    target = random_model("tiny-llama", seed=3)
    draft = copy.deepcopy(target)
    ids = random_prompt(7, seed=1)
    engine = generate(target, ids, 38, method="greedy", draft=draft, gamma=3)
    device = DeviceLoop(target, draft=draft, gamma=3).generate(ids, 38)
    assert type(device) is type(engine) is GenerationResult
    assert device.new_token_ids == engine.new_token_ids
    assert device.accepted_per_round == engine.accepted_per_round == [3] * 9 + [1]  # the last round made 2 tokens
    assert [r.new_tokens for r in device.rounds] == [r.new_tokens for r in engine.rounds] == [4] * 9 + [2]
    assert [r.stop for r in device.rounds] == [r.stop for r in engine.rounds] == ["gamma"] * 9 + ["budget"]
    assert device.tokens_per_round == engine.tokens_per_round == 3.8
    assert (device.accepted, device.accepted_per_position) == (engine.accepted, engine.accepted_per_position) == \
           (28, [10, 9, 9])
    assert (device.drafted, engine.drafted) == (30, 28)  # the device loop drafts gamma in the budget's round too
    assert device.target_calls == engine.target_calls + 1 == 11  # ten rounds and the prefill's pass
    assert device.method == "greedy"


def test_generate_runs_a_method_on_the_device_executor():
    """`generate(..., executor=DeviceExecutor())`: the same method through the recorded executor (op by op on the
    CPU), the target alone's greedy tokens for every fixed-shape method, the engine's own sampled tokens for a
    draft's chain from the same seed, one result type; the others are refused in one line."""
    from specdec_utils.core.device_loop import DeviceExecutor
    from specdec_utils.core.methods import generate

    from conftest import noisy_copy, random_eagle_head, random_model, random_prompt

    target = random_model("tiny-llama", seed=0, vocab=16)
    draft, head = noisy_copy(target, noise=0.3, seed=1), random_eagle_head(target, 2)
    ids = random_prompt(9, seed=2, vocab=16)
    executor = DeviceExecutor()
    reference = generate(target, ids, 30, method="ar").new_token_ids
    for method in ("ar", "draft", "greedy", "eagle-chain", "eagle"):
        result = generate(target, ids, 30, method=method, draft=draft, eagle=head, executor=executor)
        assert result.new_token_ids == reference and result.method == method, method
    assert len(executor.loops) == 4  # draft and greedy share one loop
    engine = generate(target, ids, 30, method="sampling", draft=draft, gamma=4, temperature=1.0, top_k=8,
                      generator=torch.Generator().manual_seed(5))
    device = generate(target, ids, 30, method="sampling", draft=draft, gamma=4, temperature=1.0, top_k=8,
                      generator=torch.Generator().manual_seed(5), executor=executor)
    n = sum(r.accepted + 1 for r in engine.rounds[:next((i for i, r in enumerate(engine.rounds) if r.drafted < 4),
                                                          len(engine.rounds))])
    assert n >= 10 and device.new_token_ids[:n] == engine.new_token_ids[:n]
    for method, kwargs, message in (("entropy-stop", {}, "runs on the engine"),
                                    ("eagle", {"params": {"prune": "confidence"}}, "unpruned"),
                                    ("draft", {"executor": "device"}, "executor must be None")):
        with pytest.raises(ValueError, match=message):
            generate(target, ids, 5, method=method, draft=draft, eagle=head,
                     **{"executor": executor, **kwargs})
