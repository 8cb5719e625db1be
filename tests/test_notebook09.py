"""Notebook 09's teaching code, run straight out of the notebook. The capture/replay (`CapturedStep`): on a GPU its
replays must equal the eager graphed step (`static_forward`) and a graphed `ModelRunner`'s replay; without CUDA the
capture cannot run, and the CPU check of the graphed step's arithmetic is `ModelRunner(model, graphs=True,
record=False)` (notebook 09, section 4, and tests/test_static_cache.py). The device round (`TeachingDeviceLoop`): op
by op on any device it must give the package's `DeviceLoop` tokens, round for round, and the target's own; on a GPU,
recorded once as one CUDA graph and replayed, the tokens of `DeviceLoop`'s own recorded round."""
import pytest
import torch

from specdec_utils import generate
from specdec_utils.core.device_loop import DeviceLoop
from specdec_utils.core.runner import (
    ModelRunner,
    attention_backends,
    forward_uncached,
    record_cuda_graph,
    static_forward,
)
from specdec_utils.core.static_cache import StaticKVCache

from conftest import noisy_copy, random_model, random_prompt, teaching_namespace

NOTEBOOK = "09_gpu_engine.ipynb"
def needs_cuda(test):
    """Run on a CUDA GPU only (`make test-gpu`)."""
    skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
    return pytest.mark.cuda(skip(test))


@pytest.fixture(scope="module")
def notebook():
    return teaching_namespace(NOTEBOOK, {"torch": torch, "static_forward": static_forward,
                                         "StaticKVCache": StaticKVCache, "record_cuda_graph": record_cuda_graph,
                                         "attention_backends": attention_backends}, min_cells=2)


def test_the_notebook_defines_the_teaching_capture(notebook):
    step = notebook["CapturedStep"]
    assert callable(step) and {"__init__", "__call__"} <= set(vars(step))


@needs_cuda
def test_captured_step_replays_the_eager_graphed_step(notebook):
    device = torch.device("cuda")
    model = random_model("tiny-llama", seed=0).to(device)
    cache = StaticKVCache.for_model(model, 64)
    prompt = random_prompt(9, 0).to(device)
    with torch.inference_mode():
        forward_uncached(model, prompt, cache, 1)
        first = torch.tensor(cache.length, device=device)
        step = notebook["CapturedStep"](lambda ids, start: static_forward(model, cache, ids, start, 1),
                                        prompt[:, -1:].clone(), first)
        outputs = []
        for position in (cache.length, cache.length + 1, cache.length + 5):
            new = random_prompt(1, position).to(device)
            start = torch.tensor(position, device=device)
            replayed = step(new, start)
            torch.testing.assert_close(replayed, static_forward(model, cache, new, start, 1), atol=1e-5, rtol=1e-5)
            outputs.append(replayed)
        assert not torch.equal(outputs[0], outputs[1])  # the inputs were copied in: another token, other logits


@needs_cuda
def test_captured_step_agrees_with_the_model_runner(notebook):
    device = torch.device("cuda")
    target = random_model("tiny-llama", seed=0).to(device)
    draft = random_model("tiny-llama", seed=1).to(device)
    prompt = random_prompt(7, 1).to(device)
    eager = generate(target, prompt, 24, method="greedy", draft=draft, gamma=4).new_token_ids
    runner = ModelRunner(target, graphs=True)
    graphed = generate(runner, prompt, 24, method="greedy", draft=ModelRunner(draft, graphs=True), gamma=4)
    assert graphed.new_token_ids == eager and runner.captures > 0
    # one step captured by the notebook's class equals the runner's replay of the same step on its own cache
    theirs = ModelRunner(target, graphs=True)
    with torch.inference_mode():
        ours = StaticKVCache.for_model(target, 64)
        forward_uncached(target, prompt, ours, 1)
        theirs.forward(prompt)                                   # the prefill: eager
        new = random_prompt(1, 5).to(device)
        start = torch.tensor(ours.length, device=device)
        step = notebook["CapturedStep"](lambda ids, s: static_forward(target, ours, ids, s, 1), new, start)
        replayed = theirs.forward(torch.cat([prompt, new], dim=1), 1)
        torch.testing.assert_close(step(new, start), replayed, atol=1e-5, rtol=1e-5)
    assert theirs.captures == theirs.replays == 1


def test_the_teaching_round_equals_the_device_loop(notebook):
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.3, seed=1)  # a draft that agrees often but not always
    loop = notebook["TeachingDeviceLoop"](target, draft, 4)
    package = DeviceLoop(target, draft=draft, gamma=4, graphs=False)
    accepted, rejected = 0, 0
    for length, seed in ((3, 0), (7, 1), (12, 2)):
        prompt = random_prompt(length, seed)
        theirs = package.generate(prompt, 30)
        alone = generate(target, prompt, 30, method="ar").new_token_ids
        assert loop.generate(prompt, 30) == theirs.new_token_ids == alone
        assert loop.reads == len(theirs.rounds)  # the same rounds, one read-back each
        accepted, rejected = accepted + theirs.accepted, rejected + theirs.drafted - theirs.accepted
    assert accepted > 0 and rejected > 0  # drafts kept and drafts rejected: both branches of the round ran


@needs_cuda
def test_the_recorded_teaching_round_equals_the_recorded_device_loop(notebook):
    device = torch.device("cuda")
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.3, seed=1).to(device)  # made on the CPU, then moved
    target = target.to(device)
    loop = notebook["TeachingDeviceLoop"](target, draft, 4)
    loop.record(torch.zeros(8, dtype=torch.long, device=device))
    recorded = DeviceLoop(target, draft=draft, gamma=4)
    for length, seed in ((3, 0), (7, 1), (12, 2)):
        prompt = random_prompt(length, seed).to(device)
        assert loop.generate(prompt, 30) == recorded.generate(prompt, 30).new_token_ids
        assert loop.reads > 1
