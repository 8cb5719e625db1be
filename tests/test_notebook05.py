"""Notebook 05's teaching `pre_verify` (M2's pre-verification of M1's tokens), run straight out of the
notebook: on its own it must return what the package's `HierarchicalProposer.pre_verify` returns (tokens,
count, the rows handed to the target, M2's distributions), greedy and sampled, and through the engine it
must give the same tokens and rounds as the package's proposer, with a model or an n-gram table as M1."""
import pytest
import torch

from specdec_utils import generate
from specdec_utils.core.engine import Sampler, decode, greedy_verify
from specdec_utils.core.hierarchy import HierarchicalProposer, HierarchyPolicy, NoLoopPolicy
from specdec_utils.core.ngram import NgramDraft
from specdec_utils.core.sampling import rejection_sample

from conftest import TINY_VOCAB, noisy_copy, random_model, random_prompt, teaching_namespace

NOTEBOOK = "05_hierarchical_drafting.ipynb"

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def notebook():
    return teaching_namespace(NOTEBOOK, {"torch": torch, "greedy_verify": greedy_verify,
                                         "rejection_sample": rejection_sample,
                                         "HierarchicalProposer": HierarchicalProposer}, min_cells=1)


@pytest.fixture(scope="module")
def models():
    target = random_model("tiny-llama", seed=0)
    middle = noisy_copy(target, noise=0.01, seed=2)
    small = noisy_copy(target, noise=0.03, seed=3)
    corpus = []
    for seed in range(10, 30):
        prompt = random_prompt(4, seed)
        corpus.append((prompt[0].tolist() + generate(target, prompt, 20, method="ar").new_token_ids, 4))
    return target, middle, {"model": small, "ngram": NgramDraft.build(corpus, TINY_VOCAB, min_count=1)}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("k", [0, 1, 4])
def test_notebook_pre_verify_returns_what_the_package_returns(notebook, k, temperature):
    proposer = notebook["NotebookProposer"].__new__(notebook["NotebookProposer"])
    package = HierarchicalProposer.__new__(HierarchicalProposer)
    sampler = Sampler(temperature, top_p=0.9 if temperature else 1.0)
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(k + 1, 12, generator=g) * 2
        small_rows = list(torch.softmax(torch.randn(k, 12, generator=g), -1))
        small_tokens = [int(torch.multinomial(row, 1, generator=g)) for row in small_rows]
        if temperature == 0 and k and seed % 2:  # make M2 agree with M1 on a prefix
            for i, token in enumerate(small_tokens[:seed % (k + 1)]):
                logits[i, token] = 50.0
        ours = proposer.pre_verify(small_tokens, small_rows, logits, sampler, torch.Generator().manual_seed(seed))
        theirs = package.pre_verify(small_tokens, small_rows, logits, sampler, torch.Generator().manual_seed(seed))
        assert ours[0] == theirs[0] and ours[1] == theirs[1]
        assert len(ours[2]) == len(theirs[2])
        for a, b in zip(ours[2], theirs[2]):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(ours[3], theirs[3])


@pytest.mark.parametrize("level", ["model", "ngram"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("make_policy", [lambda: HierarchyPolicy(gamma=6, max_small=3, theta1=3.0, theta2=3.0),
                                         lambda: HierarchyPolicy(),
                                         lambda: NoLoopPolicy(gamma=5, max_small=3)])
def test_notebook_proposer_decodes_like_the_package(notebook, models, level, temperature, make_policy):
    target, middle, smalls = models
    for seed, length in enumerate((3, 9)):
        input_ids = random_prompt(length, seed)
        runs = []
        for proposer in (notebook["NotebookProposer"], HierarchicalProposer):
            runs.append(decode(target, proposer(smalls[level], middle), make_policy(), input_ids, 24,
                               Sampler(temperature), set(), torch.Generator().manual_seed(seed), "hierarchical"))
        ours, package = runs
        assert ours.new_token_ids == package.new_token_ids
        assert [(r.drafted, r.accepted, r.stop) for r in ours.rounds] == \
               [(r.drafted, r.accepted, r.stop) for r in package.rounds]
        if temperature == 0:
            assert ours.new_token_ids == generate(target, input_ids, 24, method="ar").new_token_ids
