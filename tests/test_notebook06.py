"""Notebook 06's teaching implementations, run straight out of the notebook: the tree walk must return the same
tokens and accepted nodes as the package's `verify.verify_tree` (greedy; sampled with one-hot proposals and with
proposals drawn from q; with top-p), and the KV gather must leave the same cache as `kv_cache.gather_cache`."""
import random

import pytest
import torch

from specdec_utils.core import tree as trees
from specdec_utils.core import verify
from specdec_utils.core.engine import Sampler
from specdec_utils.core.kv_cache import cache_length, gather_cache, trim_cache
from specdec_utils.core.runner import forward_tree
from specdec_utils.core.sampling import sample_token

from conftest import random_model, random_prompt, teaching_namespace

NOTEBOOK = "06_medusa_and_token_trees.ipynb"
VOCAB = 12

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def notebook():
    return teaching_namespace(NOTEBOOK, {"torch": torch, "trees": trees, "sample_token": sample_token,
                                         "trim_cache": trim_cache}, min_cells=2)


def random_tree(size: int, seed: int):
    """A random tree whose siblings carry distinct tokens (as every proposer's do)."""
    rng = random.Random(seed)
    parents = [-1] + [rng.randrange(-1, i) for i in range(1, size)]
    nodes, used = [], {}
    for parent in parents:
        taken = used.setdefault(parent, set())
        token = rng.choice([t for t in range(VOCAB) if t not in taken])
        taken.add(token)
        nodes.append(token)
    return torch.tensor(nodes), torch.tensor(parents)


def drawn_tree(size: int, seed: int):
    """A random tree whose tokens were drawn from per-node distributions q (SpecInfer's sampled children)."""
    generator = torch.Generator().manual_seed(seed)
    _, parents = random_tree(size, seed)
    q = torch.softmax(torch.randn(size, VOCAB, generator=generator) * 2, -1)
    nodes = torch.multinomial(q, 1, generator=generator)[:, 0]
    return nodes, parents, q


@pytest.mark.parametrize("sampler", [Sampler(0.0), Sampler(1.0), Sampler(0.7, top_p=0.9)],
                         ids=["greedy", "sampled", "top-p"])
def test_notebook_walk_equals_verify_tree(notebook, sampler):
    accepted_somewhere = 0
    for seed in range(60):
        nodes, parents = random_tree(1 + seed % 13, seed)
        logits = torch.randn(len(nodes) + 1, VOCAB, generator=torch.Generator().manual_seed(1000 + seed)) * 2
        if seed % 3 == 0:  # make the walk go deeper: the target favours node 0's token at the root
            logits[0, nodes[0]] += 8
        ours = notebook["walk_tree"](nodes, parents, None, logits, sampler, torch.Generator().manual_seed(seed))
        package = verify.verify_tree(nodes, parents, None, logits, sampler, torch.Generator().manual_seed(seed))
        assert ours == package, (seed, ours, package)
        accepted_somewhere += bool(ours[1])
    assert accepted_somewhere > 5  # the test exercised accepted paths, not only immediate rejections


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_notebook_walk_with_drawn_children_equals_verify_tree(notebook, temperature):
    sampler = Sampler(temperature)
    for seed in range(60):
        nodes, parents, q = drawn_tree(1 + seed % 11, seed)
        logits = torch.randn(len(nodes) + 1, VOCAB, generator=torch.Generator().manual_seed(2000 + seed)) * 2
        ours = notebook["walk_tree"](nodes, parents, q, logits, sampler, torch.Generator().manual_seed(seed))
        package = verify.verify_tree(nodes, parents, q, logits, sampler, torch.Generator().manual_seed(seed))
        assert ours == package, (seed, ours, package)


def test_notebook_walk_emits_the_targets_greedy_token(notebook):
    nodes, parents = torch.tensor([3, 5, 7]), torch.tensor([-1, 0, 1])   # a chain 3 -> 5 -> 7
    logits = torch.full((4, VOCAB), -5.0)
    logits[0, 3] = logits[1, 5] = logits[2, 4] = logits[3, 1] = 5.0      # the target agrees with 3, 5, then wants 4
    assert notebook["walk_tree"](nodes, parents, None, logits, Sampler(0.0), None) == ([3, 5, 4], [0, 1])


@pytest.mark.parametrize("size, seed", [(1, 0), (6, 1), (11, 2)])
def test_notebook_gather_equals_gather_cache(notebook, size, seed):
    model = random_model("tiny-llama", seed=seed)
    prompt = random_prompt(5 + seed, seed)
    nodes, parents = random_tree(size, seed)
    mask = trees.tree_mask(parents)
    keeps = [torch.tensor([], dtype=torch.long), torch.arange(int(mask[0].sum()))]  # nothing; an in-place prefix
    keeps += [torch.nonzero(mask[i])[:, 0] for i in range(size)]                     # every root-to-node path
    for keep in keeps:
        with torch.no_grad():
            ours = forward_tree(model, prompt, nodes, parents, None)[1]
            package = forward_tree(model, prompt, nodes, parents, None)[1]
            notebook["gather_path"](ours, prompt.shape[1], keep)
            gather_cache(package, prompt.shape[1], keep)
        n = prompt.shape[1] + len(keep)
        assert cache_length(ours) == cache_length(package) == n
        for a, b in zip(ours.layers, package.layers):
            assert torch.equal(a.keys[..., :n, :], b.keys[..., :n, :])
            assert torch.equal(a.values[..., :n, :], b.values[..., :n, :])
        with torch.no_grad():  # and the next token's logits equal a plain forward over prompt + the kept path
            full = torch.cat([prompt, nodes[keep][None]], 1)
            follow = torch.tensor([[4]])
            after = model(input_ids=follow, past_key_values=ours, use_cache=True,
                          position_ids=torch.tensor([[n]])).logits[0, -1]
            plain = model(input_ids=torch.cat([full, follow], 1)).logits[0, -1]
        torch.testing.assert_close(after, plain, atol=1e-4, rtol=1e-4)
