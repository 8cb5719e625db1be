"""Tests of the fast corpus writer on tiny models: the pure-torch decoder computes the same logits as
transformers (left padding included) and the same greedy tokens as `generate`, the sampler draws from
the right distribution through the package's sampler (`core.sampling`), graphed decoding goes through
the package's recorder (`core.graphs`), rows whose start contains an evaluation prompt are dropped,
and the corpus file round-trips (old list-of-dicts corpora included)."""
import json
from pathlib import Path

import pytest
import torch

from specdec_lab import write_corpus
from specdec_lab.write_corpus import StaticDecoder, TokenCorpus, choose_tokens, load_corpus
from specdec_utils import training
from specdec_utils.core import graphs
from specdec_utils.core.sampling import draw, warp_logits
from specdec_utils.models import load_model, tiny_model
from specdec_utils.prompts import build_prompts

from conftest import random_model

pytestmark = pytest.mark.usefixtures("single_thread")

STARTS = [[5, 9, 17], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [100, 101, 102, 103, 104]]  # 8, 0 and 6 pads


# Rotary attention depends only on relative positions, so these logits cannot see a constant offset in one
# row's positions (harmless); they do see prefill and decode disagreeing on a position, a wrong mask, a wrong
# rotation, and a decode step reading the wrong slot.

@pytest.mark.parametrize("tied", [True, False])
def test_prefill_and_decode_logits_match_transformers_row_by_row(tied):
    model = (tiny_model("tiny-llama", vocab_size=256, seed=0) if tied else random_model("tiny-llama", seed=0)).eval()
    decoder = StaticDecoder(model, batch=3, max_len=128)
    fed = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]])  # teacher-forced decode steps
    with torch.no_grad():
        logits, P = decoder.prefill(STARTS)
        steps = [logits] + [decoder.forward(fed[:, j:j + 1], torch.tensor([P + j]), window=64) for j in range(4)]
        for row, start in enumerate(STARTS):
            reference = model(torch.tensor([start + fed[row].tolist()])).logits[0, len(start) - 1:]
            for j, got in enumerate(steps):
                torch.testing.assert_close(got[row], reference[j], atol=1e-4, rtol=0)


def test_greedy_generation_matches_transformers_generate():
    model = random_model("tiny-llama", seed=0)
    decoder = StaticDecoder(model, batch=4, max_len=128)
    steps = 60  # slots 11..70: attention windows of 64, then 128 slots
    seq, pads = decoder.generate(STARTS, steps)  # 3 rows in a batch of 4: the spare row is discarded
    assert seq.shape == (3, 11 + steps) and pads.tolist() == [8, 0, 6]
    for row, start in enumerate(STARTS):
        assert seq[row, pads[row]:11].tolist() == start
        expected = model.generate(torch.tensor([start]), max_new_tokens=steps, do_sample=False, top_p=None,
                                  top_k=None, temperature=None, pad_token_id=0)[0, len(start):].tolist()
        if 2 in expected:  # transformers stops at EOS (id 2), the decoder goes on
            expected = expected[:expected.index(2) + 1]
        assert seq[row, 11:11 + len(expected)].tolist() == expected


def test_sampler_draws_from_softmax_and_keeps_to_the_nucleus():
    torch.manual_seed(0)
    rows = 40_000
    logits = torch.tensor([2.0, 1.0, 0.5, -3.0]).expand(rows, 4)
    p = torch.softmax(logits[0], -1)  # 0.61, 0.23, 0.14, 0.005: top-p 0.95 keeps the first three
    no = torch.zeros(rows, dtype=torch.bool)
    drawn = choose_tokens(logits, torch.ones(rows), no, "sample")
    torch.testing.assert_close(torch.bincount(drawn, minlength=4) / rows, p, atol=0.01, rtol=0)
    cooler = choose_tokens(logits, torch.full((rows,), 0.5), no, "sample")
    torch.testing.assert_close(torch.bincount(cooler, minlength=4) / rows, torch.softmax(logits[0] / 0.5, -1),
                               atol=0.01, rtol=0)
    opening = torch.arange(rows) % 2 == 0  # even rows: the opening's T=1 nucleus; odd rows: greedy
    mixed = choose_tokens(logits, torch.zeros(rows), opening, "nucleus")
    assert (mixed[~opening] == 0).all()
    nucleus = torch.cat([p[:3] / p[:3].sum(), torch.zeros(1)])
    assert (mixed[opening] != 3).all()
    torch.testing.assert_close(torch.bincount(mixed[opening], minlength=4) / (rows // 2), nucleus, atol=0.015, rtol=0)
    assert (choose_tokens(logits, torch.ones(rows), no, "greedy") == 0).all()


def test_sampled_tokens_are_the_package_samplers_draws():
    """Every sampled row is `sampling.draw` of its `sampling.warp_logits` row (temperature, or T=1 with top-p for an
    opening row) at one uniform per row from torch's generator; greedy rows are the argmax. Another sampler (the
    exponential race this replaced) gives other tokens from the same seed."""
    rows, vocab = 64, 50
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.5]).repeat(rows // 4)
    for kind, opening in (("sample", torch.zeros(rows, dtype=torch.bool)), ("nucleus", torch.arange(rows) % 3 == 0)):
        torch.manual_seed(1)
        got = choose_tokens(logits, temperature, opening, kind)
        torch.manual_seed(1)
        uniforms = torch.rand(rows, dtype=torch.float64)
        for row in range(rows):
            t, top_p = (1.0, write_corpus.TOP_P) if opening[row] else (float(temperature[row]), 1.0)
            expected = draw(warp_logits(logits[row], t, top_p=top_p)[None], uniforms[row:row + 1])[0] if t else \
                logits[row].argmax()
            assert got[row] == expected, (kind, row)
        assert len(set(got[temperature > 0].tolist())) > 5  # sampled, not one repeated token


class _FakeGraph:
    def __init__(self, step):
        self.step = step

    def replay(self):
        self.step()


def test_graphed_decoding_records_through_the_package_recorder(monkeypatch):
    """On CUDA, `_decode` records each (sampler, window) step once through `GraphCache.record` (the package's
    `record_cuda_graph`, one warm-up, one shared pool) and replays it. Here a fake recorder runs the warm-up and
    replays eagerly: the tokens are the eager decoder's, the warm-up's advance of the slot undone."""
    calls = []

    def record(step, pool=None, warmups=1):
        calls.append((pool, warmups))
        for _ in range(warmups):
            step()
        return _FakeGraph(step), None

    monkeypatch.setattr(graphs, "record_cuda_graph", record)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    model = random_model("tiny-llama", seed=0)
    eager = StaticDecoder(model, batch=4, max_len=128)
    graphed = StaticDecoder(model, batch=4, max_len=128)
    assert eager.graphs is None and graphed.graphs is None  # the CPU: eager
    graphed.graphs = graphs.GraphCache()
    expected = [t.clone() for t in eager.generate(STARTS, 60)]
    for _ in range(2):
        got = graphed.generate(STARTS, 60)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert set(graphed.graphs) == {("greedy", 64), ("greedy", 128)} and graphed.graphs.captures == 2  # kept
    assert len(calls) == 2 and calls[0][0] is calls[1][0] is graphed.graphs.pool and calls[0][1] == 1
    got = graphed.generate(STARTS, 8, temperature=[0.0, 0.7, 0.0], opening=[2, 0, 0])  # row 2 greedy throughout
    assert set(graphed.graphs) - {("greedy", 64), ("greedy", 128)} == {("nucleus", 64), ("sample", 64)}
    assert graphed.graphs.captures == 4 and torch.equal(got[0][2], expected[0][2, :19])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphs_recorded_by_the_package_recorder_replay_the_eager_steps_on_a_gpu():
    """The real recordings (`make test-gpu`): the corpus writer's graphed decoding writes the eager greedy tokens
    (a greedy row beside sampled ones too), and step_bench's graphed plain step gives the eager logits."""
    from specdec_lab.step_bench import PlainStep
    model = random_model("tiny-llama", seed=0, vocab=1024).cuda()  # float32; step_bench feeds ids below 1000
    eager = StaticDecoder(model, batch=4, max_len=128, graphs=False)
    graphed = StaticDecoder(model, batch=4, max_len=128)
    expected = [t.clone() for t in eager.generate(STARTS, 60)]
    for _ in range(2):  # recorded, then replayed from the cache
        assert all(torch.equal(a, b) for a, b in zip(graphed.generate(STARTS, 60), expected))
    assert set(graphed.graphs) == {("greedy", 64), ("greedy", 128)} and graphed.graphs.captures == 2
    got = graphed.generate(STARTS, 8, temperature=[0.0, 0.7, 0.0], opening=[2, 0, 0])
    assert torch.equal(got[0][2], expected[0][2, :19]) and graphed.graphs.captures == 4
    with torch.inference_mode():
        step = PlainStep(model, cache_len=40, n=5, compiled=False)
        step.graph()
        torch.testing.assert_close(step.logits.float(), step.reference, atol=1e-4, rtol=1e-4)


def test_the_lab_records_cuda_graphs_only_through_the_package_recorder():
    """One recorder (`core.graphs.record_cuda_graph`, or a `GraphCache` over it): no lab module captures by hand,
    and the GPU-only tools that record graphs still import on a machine without CUDA."""
    import importlib
    import re

    lab = Path(write_corpus.__file__).parent
    by_hand = re.compile(r"torch\.cuda\.CUDAGraph\(|torch\.cuda\.graph\(|capture_begin|make_graphed_callables")
    found = [f"{path.name}:{n}" for path in sorted(lab.glob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if by_hand.search(line)]
    assert not found, f"hand-written CUDA graph captures in the lab: {found}"
    for name in ("step_bench", "tree_attention_bench"):
        module = importlib.import_module(f"specdec_lab.{name}")
        assert module.record_cuda_graph is graphs.record_cuda_graph


def test_decoder_refuses_other_rotary_embeddings():
    model = tiny_model("tiny-llama", vocab_size=64)
    model.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="default rotary embedding"):
        StaticDecoder(model, batch=1, max_len=64)


@pytest.fixture(scope="module")
def tiny_writer():
    model, tokenizer = load_model("tiny-llama", device="cpu")
    return model, tokenizer, StaticDecoder(model, batch=4, max_len=128)


def test_rows_whose_start_contains_an_eval_prompt_are_dropped(tiny_writer):
    model, tokenizer, decoder = tiny_writer
    prompt = build_prompts("eval")[0]["prompt"]
    texts = ["Once upon a time", f"Some notes. {prompt} and more", "import os\n", "Hello"]
    starts = tokenizer(texts, add_special_tokens=False).input_ids
    part = write_corpus.write_batch(decoder, tokenizer, starts, ["docs"] * 4, [0, 0, 0, 2], [0.0] * 4, 8,
                                    [r["prompt"] for r in build_prompts("eval")])
    assert part["dropped_for_eval"] == 1 and len(part["lengths"]) == 3
    kept = [tokenizer.decode(row[:n].tolist()) for row, n in zip(part["tokens"], part["prompt_len"])]
    assert kept[:2] == [texts[0], texts[2]] and kept[2].startswith("Hello") and all(prompt not in t for t in kept)
    # the last row's two sampled opening tokens count as start (and as 2 of its 8 generated tokens)
    assert part["prompt_len"].tolist() == [len(starts[0]), len(starts[2]), len(starts[3]) + 2]
    assert (part["lengths"] - part["prompt_len"]).tolist() == [8, 8, 6]
    assert (part["tokens"][0, len(starts[0]) + 8:] == -1).all()


class CannedDecoder:
    """Stands in for StaticDecoder: `generate` returns fixed rows (P = 3 start slots, 4 generated tokens)."""
    rows = [[7, 8, 9, 10, 2, 11, 12],   # EOS in the continuation: cut after it, EOS kept
            [0, 0, 5, 2, 3, 4, 5],      # EOS in the 1-token sampled opening: dropped
            [0, 6, 6, 2, 3, 3, 3],      # 1 continuation token: dropped
            [4, 4, 4, 13, 14, 15, 2]]   # 1 opening token (counts as start), then 3 continuation tokens

    def generate(self, starts, steps, temperature, opening):
        return torch.tensor(self.rows), torch.tensor([0, 2, 1, 0])


def test_rows_are_cut_after_the_first_eos_of_their_continuation(tiny_writer):
    tokenizer = tiny_writer[1]
    part = write_corpus.write_batch(CannedDecoder(), tokenizer, None, ["code"] * 4, [0, 1, 0, 1], [0.0, 0.0, 0.0, 1.0],
                                    4, [])
    assert tokenizer.eos_token_id == 2 and part["dropped_for_eval"] == 0
    assert part["tokens"].tolist() == [[7, 8, 9, 10, 2, -1, -1], [4, 4, 4, 13, 14, 15, 2]]
    assert part["lengths"].tolist() == [5, 7] and part["prompt_len"].tolist() == [3, 4]
    assert part["mode"].tolist() == [0, 1] and part["kind"].tolist() == [write_corpus.KINDS.index("code")] * 2


def test_token_corpus_round_trip_and_old_format(tmp_path):
    rows = [{"ids": [5, 6, 7, 8], "prompt_len": 2, "kind": "code", "mode": "greedy"},
            {"ids": [9, 10, 11, 12, 13, 14, 2], "prompt_len": 3, "kind": "prompt", "mode": "sampled"},
            {"ids": [1, 3, 4], "prompt_len": 1, "kind": "prompt", "mode": "greedy"}]
    torch.save(rows, tmp_path / "old.pt")
    old = load_corpus(tmp_path / "old.pt")
    assert len(old) == 3 and list(old) == rows and old.num_tokens == 14
    assert old.continuation_tokens().tolist() == [7, 8, 12, 13, 14, 2, 3, 4]
    old.save(tmp_path / "new.pt")
    new = load_corpus(tmp_path / "new.pt")
    assert [new[i] for i in range(len(new))] == rows
    for max_len in (None, 5, 2):
        ids, mask = new.batch([2, 0, 1], max_len, "cpu")
        ref_ids, ref_mask = training.batch(rows, [2, 0, 1], max_len, "cpu")
        assert torch.equal(ids, ref_ids) and torch.equal(mask, ref_mask)
    assert isinstance(new, TokenCorpus) and new.kind_names == ["code", "prompt"]


def test_cli_writes_a_corpus_and_its_log(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(write_corpus, "QUESTION_TOKENS", 8)  # a random model seldom ends its question anyway
    out = tmp_path / "corpus.pt"
    assert write_corpus.main(["--target", "tiny-llama", "--device", "cpu", "--tokens", "100", "--batch", "4",
                              "--new-tokens", "8", "--out", str(out)]) == 0
    corpus, log = load_corpus(out), json.loads(out.with_suffix(".json").read_text())
    assert log["continuation_tokens"] >= 100 and log["rows"] == len(corpus) > 0
    assert sum(log["rows_per_kind"].values()) == len(corpus) and log["dropped_for_eval"] == 0
    assert all(2 <= len(row["ids"]) - row["prompt_len"] <= 8 for row in corpus)
    assert "tokens/s" in capsys.readouterr().out
    assert log["mix"] == write_corpus.BATCH_KINDS and set(log["seconds_per_phase"]) == {"starts", "generate"}
    assert write_corpus.main(["--target", "tiny-llama", "--device", "cpu", "--tokens", "30", "--batch", "4",
                              "--new-tokens", "8", "--out", str(out), "--mix", "code=1,docs=0"]) == 0
    assert set(load_corpus(out).kind.tolist()) == {write_corpus.KINDS.index("code")}
    for argv, message in ((["--batch", "0"], "--batch must be >= 1"),
                          (["--mix", "poems=1"], "--mix: shares >= 0"),
                          (["--mix", "code"], "--mix: comma-separated"),
                          (["--mix", "code=0"], "--mix: shares >= 0"),
                          (["--sampled-fraction", "2"], "--sampled-fraction must be in"),
                          (["--new-tokens", "1"], "--new-tokens must be >= 2")):
        with pytest.raises(SystemExit):
            write_corpus.parse_args(argv)
        assert message in capsys.readouterr().err


@pytest.mark.slow
def test_greedy_generation_matches_transformers_on_the_real_target():
    model, tokenizer = load_model("smollm2-135m", device="cpu", dtype=torch.float32)
    texts = ["The capital of France is", "def fibonacci(n):",
             tokenizer.apply_chat_template([{"role": "user", "content": "Explain gravity."}], tokenize=False,
                                           add_generation_prompt=True)]
    starts = tokenizer(texts, add_special_tokens=False).input_ids
    seq, _ = StaticDecoder(model, batch=3, max_len=64).generate(starts, 16)
    for row, start in zip(seq, starts):
        expected = model.generate(torch.tensor([start]), max_new_tokens=16, do_sample=False, top_p=None, top_k=None,
                                  temperature=None, pad_token_id=tokenizer.eos_token_id)[0, len(start):].tolist()
        assert row[-16:].tolist()[:len(expected)] == expected
