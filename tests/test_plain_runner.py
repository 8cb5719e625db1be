"""The plain-torch runner (core/plain_llama.py): transformers' arithmetic, and every method lossless through it.

On the CPU the padded whole-buffer step (what a CUDA graph records) runs unrecorded (`graphs=True,
record=False`): the same inputs, the same pad rows and masks, so its arithmetic is tested here; the recording
itself by the CUDA-only test at the end and on the GPU by `specdec_lab/tree_graph_bench.py`."""
import pytest
import torch

from specdec_utils import generate
from specdec_utils.core.engine import Sampler
from specdec_utils.core.hidden import capture_hidden
from specdec_utils.core.medusa import MedusaHeads
from specdec_utils.core.plain_llama import PlainRunner
from specdec_utils.core.tree import chain_parents
from specdec_utils.exactness import chi_square_p_value, exact_distribution, sample_outputs
from specdec_utils.models import tiny_model

from conftest import noisy_copy, random_eagle_head, random_model, random_prompt

pytestmark = pytest.mark.usefixtures("single_thread")
MODES = {"eager": dict(graphs=False), "padded": dict(graphs=True, record=False)}


def untied_target(vocab: int, seed: int):
    """A tiny Llama with an untied random output head (a tied one mostly repeats its last token)."""
    target = tiny_model("tiny-llama", vocab_size=vocab, seed=seed).eval()
    weight = torch.randn(vocab, 64, generator=torch.Generator().manual_seed(seed)) / 8
    target.lm_head.weight = torch.nn.Parameter(weight)
    return target


@pytest.mark.parametrize("mode", MODES)
def test_chain_and_tree_passes_give_the_models_logits_and_hidden_states(mode):
    target = untied_target(96, 3)
    ids = torch.randint(3, 96, (1, 30), generator=torch.Generator().manual_seed(0))
    runner = PlainRunner(target, **MODES[mode])
    runner.begin(10)
    with torch.no_grad():
        full = target(ids, output_hidden_states=True)
        logits, states = runner.forward(ids[:, :10], 2, hidden=(0, 1, 2))  # the prefill: eager in every mode
        torch.testing.assert_close(logits, full.logits[0, 8:10], atol=1e-4, rtol=1e-4)
        expected = torch.cat([full.hidden_states[0], full.hidden_states[1], full.hidden_states[2]], -1)[0, :10]
        # hidden_states[2] of transformers is after the final norm; ours (index 2 = layers) before it
        torch.testing.assert_close(states[:, :128], expected[:, :128], atol=1e-4, rtol=1e-4)
        for end, keep in ((11, 1), (14, 2), (19, 5)):  # chain steps of 1, 3, 5 tokens: padded to 1, 4, 8 rows
            logits, head = runner.forward(ids[:, :end], keep, hidden="head")
            torch.testing.assert_close(logits, full.logits[0, end - keep:end], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(head, full.hidden_states[-1][0, end - keep:end], atol=1e-4, rtol=1e-4)
        # a tree after 20 committed tokens (19 cached, the newest one fed with the nodes): two branches
        parents = torch.tensor([-1, 0, 0, -1, 3])
        nodes = torch.tensor([40, 41, 42, 50, 51])
        logits, norm_in = runner.forward_tree(ids[:, :20], nodes, parents, num_logits=6, hidden="norm")
        assert runner.length == 20 + 5
        for path in ([0, 1], [0, 2], [3, 4]):
            seq = torch.cat([ids[0, :20], nodes[path]])[None]
            with capture_hidden(target, "norm") as captured:
                ref = target(seq)
            torch.testing.assert_close(logits[1 + path[-1]], ref.logits[0, -1], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(norm_in[1 + path[-1]], captured[0][0, -1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logits[0], full.logits[0, 19], atol=1e-4, rtol=1e-4)
        # keep branch [3, 4]: its keys move into place; the next step sees them as if fed in a chain
        runner.commit(20, [3, 4], 22)
        assert runner.length == 22
        seq = torch.cat([ids[0, :20], nodes[[3, 4]], torch.tensor([7])])[None]
        torch.testing.assert_close(runner.forward(seq, 1)[0], target(seq).logits[0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_a_draft_grows_its_tree_on_top_of_cached_nodes(mode):
    """`fed` > 0: the draft's own cache holds the committed tokens and the tree's first nodes."""
    model = untied_target(96, 4)
    ids = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(1))
    runner = PlainRunner(model, **MODES[mode])
    runner.begin(12)
    with torch.no_grad():
        runner.forward(ids)
        runner.forward_tree(ids, torch.tensor([20, 21]), torch.tensor([-1, -1]), fed=0, num_logits=2)
        logits = runner.forward_tree(ids, torch.tensor([20, 21, 30, 31, 32]), torch.tensor([-1, -1, 0, 1, 1]),
                                     fed=2, num_logits=3)
        for row, path in enumerate(([20, 30], [21, 31], [21, 32])):
            seq = torch.cat([ids[0], torch.tensor(path)])[None]
            torch.testing.assert_close(logits[row], model(seq).logits[0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_every_method_through_the_plain_runner_is_token_identical_to_the_target_alone(mode):
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.02, seed=1)
    heads = MedusaHeads(target, 3)
    head = random_eagle_head(target, 2)
    for seed, length in ((5, 9), (6, 17)):
        ids = random_prompt(length, seed=seed)
        reference = generate(target, ids, 40, method="ar").new_token_ids
        runner = PlainRunner(target, taps=head.target_hidden if seed == 5 else (), **MODES[mode])
        draft_runner = PlainRunner(draft, **MODES[mode])
        runner.prepare()  # every budget's pass once (recorded on a GPU): the cache is emptied after
        for method, gamma, params in (("ar", None, None), ("greedy", 4, None), ("greedy", 7, None),
                                      ("draft-tree", 4, None), ("medusa", 3, {"tree": "cartesian"}),
                                      ("eagle-chain", 5, None), ("eagle", 6, None)):
            out = generate(runner, ids, 40, method=method, draft=draft_runner, heads=heads, eagle=head, gamma=gamma,
                           params=params)
            assert out.new_token_ids == reference, (method, gamma)
        assert runner.replays > 0 if mode == "padded" else runner.replays == 0
        if mode == "padded" and seed == 5:  # EAGLE's features come out of the padded step: no eager pass
            before = runner.forwards - runner.replays
            generate(runner, ids, 40, method="eagle", eagle=head)
            assert runner.forwards - runner.replays == before + 1  # the prefill only


def test_runner_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="plain Llama"):
        PlainRunner(tiny_model("tiny-gpt2", vocab_size=64))
    with pytest.raises(ValueError, match="compile=True needs graphs=True"):
        PlainRunner(tiny_model("tiny-llama", vocab_size=64), compile=True)
    with pytest.raises(ValueError, match="budgets must be integers"):
        PlainRunner(tiny_model("tiny-llama", vocab_size=64), budgets=(0, 4))
    runner = PlainRunner(tiny_model("tiny-llama", vocab_size=64))
    runner.begin(4)
    runner.forward(torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="cannot precede a tree pass"):
        runner.forward_tree(torch.tensor([[1, 2]]), torch.tensor([5, 6]), torch.tensor([-1, -1]))
    with pytest.raises(ValueError, match="nothing to feed"):
        runner.forward_tree(torch.tensor([[1, 2]]), torch.tensor([5]), chain_parents(1))
    with pytest.raises(ValueError, match="layer indices"):
        runner.forward(torch.tensor([[1, 2, 3, 4]]), hidden=(9,))


def test_the_runner_grows_past_its_first_capacity():
    target = untied_target(64, 5)
    runner = PlainRunner(target, graphs=True, record=False)
    ids = torch.randint(3, 64, (1, 300), generator=torch.Generator().manual_seed(2))
    reference = generate(target, ids[:, :5], 200, method="ar").new_token_ids
    assert generate(runner, ids[:, :5], 200, method="ar").new_token_ids == reference
    assert runner.core.capacity >= 205


@pytest.mark.stat
def test_sampled_eagle_tree_through_the_padded_step_is_exact():
    """The enumeration test of the EAGLE lesson, with the target on the plain runner's padded step."""
    target = untied_target(4, 1)
    head = random_eagle_head(target, 5)
    prompt = torch.tensor([[1, 3, 0]])
    exact = exact_distribution(target, prompt, 5, Sampler(1.0))
    runner = PlainRunner(target, graphs=True, record=False)
    counts = sample_outputs(lambda g: generate(runner, prompt, 5, method="eagle", eagle=head, gamma=3,
                                               temperature=1.0, generator=g,
                                               params={"width": 2, "tree_nodes": 8}).new_token_ids, 3000)
    assert chi_square_p_value(counts, exact) > 1e-3


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_recorded_graphs_replay_the_padded_step():
    target = untied_target(64, 6)
    draft = noisy_copy(target, noise=0.02, seed=1).cuda()
    head = random_eagle_head(target, 2)  # made on the CPU (its random offsets are), then moved with the target
    target, head = target.cuda(), head.cuda()
    ids = torch.randint(3, 64, (1, 9), generator=torch.Generator().manual_seed(3)).cuda()
    reference = generate(target, ids, 40, method="ar").new_token_ids
    runner = PlainRunner(target, graphs=True, taps=head.target_hidden)
    draft_runner = PlainRunner(draft, graphs=True)
    for method in ("ar", "greedy", "draft-tree", "eagle-chain", "eagle"):
        assert generate(runner, ids, 40, method=method, draft=draft_runner, eagle=head).new_token_ids == reference
    assert runner.captures > 0 and draft_runner.captures > 0


@pytest.mark.slow  # the real target and the shipped draft (a reduced vocabulary), on the padded step
def test_the_gpu_benchmark_cli_checks_identity_on_the_cpu(tmp_path):
    """`tree_graph_bench --device cpu` runs the identity part's code on the padded (unrecorded) step: every method
    on the real target, with draft-m's reduced vocabulary, the Medusa heads and the EAGLE head."""
    import json
    import subprocess
    import sys
    out = tmp_path / "identity.json"
    run = subprocess.run([sys.executable, "-m", "specdec_lab.tree_graph_bench", "--part", "identity",
                          "--device", "cpu", "--prompts", "1", "--max-new-tokens", "10", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["methods"]) == {"ar", "greedy", "eagle-chain", "medusa", "draft-tree", "eagle"}
    assert all(c == {"same_as_eager": 1, "same_as_ar": 1} for c in result["methods"].values())
    assert result["replays"] > 0


def test_a_reduced_vocabulary_draft_gives_its_own_logits():
    from specdec_utils.models import ReducedVocabLlamaForCausalLM
    config = tiny_model("tiny-llama", vocab_size=33).config
    config.full_vocab_size = 96
    draft = ReducedVocabLlamaForCausalLM(config).eval()
    draft.set_vocab(torch.arange(0, 96, 3))
    ids = torch.tensor([[3, 6, 7, 9, 50, 12]])  # 7 and 50 are outside its vocabulary
    runner = PlainRunner(draft, graphs=True, record=False)
    runner.begin(6)
    with torch.no_grad():
        runner.forward(ids[:, :4])
        torch.testing.assert_close(runner.forward(ids, 2), draft(ids).logits[0, -2:], atol=1e-4, rtol=1e-4)
