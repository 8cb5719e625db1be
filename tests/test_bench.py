"""Tests of the benchmark CLI (`python -m specdec_lab.bench`): every bad argument is one line on
stderr with exit status 2, and a tiny end-to-end run writes the records it promises."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig

from specdec_lab import bench
from specdec_utils import measure
from specdec_utils.models import ReducedVocabLlamaForCausalLM, ensure_target_cache, tiny_model
from specdec_utils.speculative import autoregressive_generate
from specdec_utils.utils import REPO_ROOT

RECORD_KEYS = {"id", "method", "new_token_ids", "text", "wall_s", "new_tokens", "target_calls", "drafted",
               "accepted", "gamma", "temperature", "dtype", "device", "device_name", "versions", "date", "cuda_graphs"}


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    rows = [{"id": "story", "prompt": "Once upon a time"},
            {"id": "chat", "prompt": "Give me three tips for sleep.", "chat": True}]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def other_vocab_model(tmp_path_factory):
    """A local model folder with the target's tokenizer but a 256-token output layer."""
    path = tmp_path_factory.mktemp("other-vocab")
    tiny_model("tiny-llama", vocab_size=256).save_pretrained(path)
    AutoTokenizer.from_pretrained(ensure_target_cache()).save_pretrained(path)
    return path


def run_main(capsys, argv):
    code = bench.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


TINY = ["--target", "tiny-llama", "--draft", "tiny-gpt2"]  # for errors found after loading the models


# Each message is matched on the argument it names and the key allowed value, not word for word.
@pytest.mark.parametrize("argv, message", [
    (["--gamma", "0"], r"--gamma: .*>= 1"),
    ([*TINY, "--methods", "hierarchical", "--draft-small", "draft-x"], r"--draft-small: .*'draft-x'"),
    ([*TINY, "--methods", "hierarchical", "--param", "hierarchical.max_small=-1"], r"--param: max_small.*>= 0"),
    (["--gamma", "two"], r"--gamma: .*>= 1"),
    (["--temperature", "-1"], r"--temperature: .*>= 0"),
    (["--top-p", "0"], r"--top-p: .*\(0, 1\]"),
    (["--top-p", "1.5"], r"--top-p: .*\(0, 1\]"),
    (["--max-new-tokens", "0"], r"--max-new-tokens: .*>= 1"),
    (["--methods", "ar,beam"], r"--methods: .*'beam'.*allowed: .*greedy"),
    (["--methods", ","], r"--methods: .*','.*allowed"),
    (["--dtype", "float64"], r"--dtype: .*'float64'"),
    (["--device", "tpu"], r"--device: .*'tpu'.*allowed: .*cpu"),
    (["--gama", "3"], r"unrecognized arguments: --gama"),
    (["--seed", "99999999999999999999999"], r"--seed: .*\[0, 2\*\*63\)"),
    (["--prompts", "no/such/file.jsonl"], r"--prompts: .*no/such/file.jsonl"),
    (["--methods", "ar,entropy"], r"--methods: .*'entropy'.*allowed: .*entropy-stop"),
    (["--param", "tau=2"], r"--param: .*METHOD.NAME=VALUE"),
    (["--param", "entropy.tau=2"], r"--param: .*'entropy'.*allowed: .*entropy-stop"),
    (["--param", "entropy-stop.tua=2"], r"--param: .*'tua'.*allowed: .*theta"),
    (["--param", "greedy.tau=2"], r"--param: .*'tau'.*'greedy'.*allowed: gamma"),
    ([*TINY, "--param", "adaedl.lam0=0.5"], r"--param: .*'adaedl'.*--methods"),
    ([*TINY, "--methods", "entropy-stop", "--param", "entropy-stop.theta=-1"], r"--param: theta.*>= 0"),
    ([*TINY, "--methods", "confidence-stop", "--param", "confidence-stop.threshold=high"],
     r"--param: threshold.*\[0, 1\]"),
    ([*TINY, "--methods", "learned-stop"], r"--param: .*'learned-stop'.*stop head"),
    (["--target", "no-such-model"], r"--target: .*'no-such-model'.*smollm2-135m"),
    (["--tree-nodes", "0"], r"--tree-nodes: .*>= 1"),
    (["--prune", "magic"], r"--prune: .*'magic'"),
    (["--target", "tiny-llama", "--methods", "medusa", "--heads", "no/such/heads"], r"--heads: .*no/such/heads"),
    (["--target", "tiny-llama", "--draft", "tiny-llama", "--methods", "draft-tree", "--param", "draft-tree.width=0"],
     r"--param: width.*>= 1"),
    (["--target", "tiny-llama", "--draft", "no-such-model"], r"--draft: .*'no-such-model'"),
    (["--target", "tiny-llama", "--draft", "tiny-llama", "--device", "cpu", "--cuda-graphs"], r"--cuda-graphs: .*CUDA"),
])
def test_bad_arguments_give_one_line_and_status_2(capsys, argv, message):
    code, out, err = run_main(capsys, argv)
    assert code == 2 and out == ""
    assert err.startswith("bench: error: ") and re.search(message, err), err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_invalid_prompts_file(capsys, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 1, "prompt": "ok"}\nnot json\n')
    code, _, err = run_main(capsys, ["--prompts", str(path)])
    assert code == 2 and f"argument --prompts: {path}:2: not valid JSON" in err and err.count("\n") == 1


def test_per_category_picks_the_balanced_subset_and_excludes_a_prompts_file(capsys, tmp_path):
    """--per-category K reads eval_subset(K) (the committed GPU board's 40 prompts are K = 8); with --prompts too,
    or K < 1, one error line."""
    from specdec_lab import bench as bench_tool
    from specdec_utils.prompts import eval_subset
    rows = bench_tool.read_prompts(None, 8)
    assert [r["id"] for r in rows] == [r["id"] for r in eval_subset(8)] and len(rows) == 40
    assert [r["id"] for r in bench_tool.read_prompts(None)] == [r["id"] for r in eval_subset(2)]
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 1, "prompt": "ok"}\n')
    for argv, message in ((["--prompts", str(path), "--per-category", "3"], "give one of them, not both"),
                          (["--per-category", "0"], "argument --per-category: .*>= 1")):
        code, out, err = run_main(capsys, argv)
        assert code == 2 and out == "" and re.search(message, err) and err.count("\n") == 1, err


def test_out_must_not_be_a_folder(capsys, tmp_path):
    code, _, err = run_main(capsys, ["--out", str(tmp_path)])
    assert code == 2 and "argument --out:" in err and err.count("\n") == 1


def test_draft_with_another_vocabulary_is_rejected_before_running(capsys, other_vocab_model):
    code, out, err = run_main(capsys, ["--target", "tiny-llama", "--draft", str(other_vocab_model)])
    assert code == 2 and out == ""
    assert "argument --draft:" in err and "outputs 256 token ids" in err and "share the target's tokenizer" in err
    assert err.count("\n") == 1


def test_command_line_error_has_no_traceback():
    process = subprocess.run([sys.executable, "-m", "specdec_lab.bench", "--gamma", "0"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=120)
    assert process.returncode == 2 and process.stdout == ""
    lines = process.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"bench: error: argument --gamma: .*>= 1", lines[0]), process.stderr


def test_end_to_end_run_writes_the_records(capsys, prompts_file, tmp_path):
    """tiny-gpt2 as the draft of tiny-llama (same tokenizer, unrelated weights): greedy methods
    must reproduce the target's greedy output whatever the draft proposes."""
    out_file = tmp_path / "results" / "bench.json"
    methods = ["ar", "greedy", "sampling", "hf-assisted", "hf-assisted-heuristic", "hf-prompt-lookup"]
    code, out, err = run_main(capsys, ["--target", "tiny-llama", "--draft", "tiny-gpt2", "--methods", ",".join(methods),
                                       "--prompts", str(prompts_file), "--max-new-tokens", "11", "--gamma", "3",
                                       "--device", "cpu", "--out", str(out_file)])
    assert code == 0, err
    assert "speedup vs ar" in out and all(method in out for method in methods)
    records = json.loads(out_file.read_text())
    assert [(r["id"], r["method"]) for r in records] == [(i, m) for i in ("story", "chat") for m in methods]
    for record in records:
        assert RECORD_KEYS <= record.keys()
        assert record["new_tokens"] == len(record["new_token_ids"]) <= 11
        assert (record["gamma"], record["dtype"], record["device"]) == (3, "float32", "cpu")
    by_key = {(r["id"], r["method"]): r for r in records}
    for prompt_id in ("story", "chat"):
        ar = by_key[prompt_id, "ar"]
        assert ar["target_calls"] == ar["new_tokens"] and ar["drafted"] == 0
        for method in ("greedy", "hf-assisted", "hf-assisted-heuristic", "hf-prompt-lookup"):
            assert by_key[prompt_id, method]["new_token_ids"] == ar["new_token_ids"], method
            assert by_key[prompt_id, method]["text"] == ar["text"]
        for method in ("greedy", "sampling", "hf-assisted", "hf-assisted-heuristic"):
            record = by_key[prompt_id, method]
            assert record["new_tokens"] == record["accepted"] + record["target_calls"]
            assert record["draft_calls"] == record["drafted"] > 0
        lookup = by_key[prompt_id, "hf-prompt-lookup"]
        assert lookup["draft_calls"] == 0 and lookup["drafted"] == -1 and lookup["target_calls"] <= lookup["new_tokens"]
    assert records[0]["versions"]["torch"] == torch.__version__ and records[0]["cuda_graphs"] is False
    from specdec_utils.report import cpu_info  # the CPU named by model and kind: one kind's machines still differ
    assert records[0]["device_name"].startswith(f"{cpu_info()['model']}, ") and "CPU kind" in records[0]["device_name"]


def test_every_engine_method_runs_from_the_command_line(capsys, prompts_file, tmp_path):
    """The drafting policies of notebooks 03 and 04 through the CLI, greedy: each reproduces `ar`,
    and each record carries the sums of the per-round statistics."""
    out_file = tmp_path / "policies.json"
    methods = ["ar", "greedy", "adaptive-hf", "adaptive-dual", "oracle", "entropy-stop", "confidence-stop", "adaedl"]
    code, out, err = run_main(capsys, ["--target", "tiny-llama", "--draft", "tiny-gpt2", "--methods", ",".join(methods),
                                       "--prompts", str(prompts_file), "--max-new-tokens", "9", "--device", "cpu",
                                       "--param", "entropy-stop.theta=1.5", "--param", "adaedl.lam0=0.5",
                                       "--out", str(out_file)])
    assert code == 0, err
    records = json.loads(out_file.read_text())
    by_key = {(r["id"], r["method"]): r for r in records}
    for prompt_id in ("story", "chat"):
        for method in methods:
            record = by_key[prompt_id, method]
            assert record["new_token_ids"] == by_key[prompt_id, "ar"]["new_token_ids"]
            assert record["rounds"] == record["target_calls"]
            assert sum(record["stops"].values()) == record["rounds"]
            assert min(record["draft_ms"], record["verify_ms"], record["bookkeeping_ms"]) >= 0
        assert by_key[prompt_id, "entropy-stop"]["params"] == {"theta": 1.5}
        assert by_key[prompt_id, "oracle"]["accepted"] == by_key[prompt_id, "oracle"]["drafted"]
    assert "wasted/token" in out and "draft calls/token" in out


@pytest.mark.parametrize("small", ["tiny-llama", "ngram"])
def test_hierarchical_methods_run_from_the_command_line(capsys, prompts_file, tmp_path, small):
    """`--draft-small` is M1 under `--draft` (M2): a model, or the shipped n-gram table; greedy output is
    the target's, and the records carry the per-level counts."""
    out_file = tmp_path / "hierarchy.json"
    methods = ["ar", "hierarchical", "hierarchical-noloop"]
    code, out, err = run_main(capsys, ["--target", "tiny-llama", "--draft", "tiny-gpt2", "--draft-small", small,
                                       "--methods", ",".join(methods), "--prompts", str(prompts_file),
                                       "--max-new-tokens", "12", "--device", "cpu",
                                       "--param", "hierarchical.theta2_0=9.0", "--out", str(out_file)])
    assert code == 0, err
    assert f"under draft-small {small}" in out
    records = json.loads(out_file.read_text())
    by_key = {(r["id"], r["method"]): r for r in records}
    for prompt_id in ("story", "chat"):
        for method in methods[1:]:
            record = by_key[prompt_id, method]
            assert record["new_token_ids"] == by_key[prompt_id, "ar"]["new_token_ids"]
            detail = record["detail"]
            assert detail["small_accepted"] + detail["middle_tokens"] == record["drafted"]
            assert record["draft_calls"] == detail["middle_forwards"]
            assert record["small_calls"] == (0 if small == "ngram" else detail["small_forwards"])


def test_eagle_rows_record_the_head_they_measured(capsys, prompts_file, tmp_path):
    """Each `eagle` and `eagle-chain` record names its head (where from, training steps, the weights' hash), so that
    a lesson can tell a run of the shipped head from one of the head it replaced; `ar`'s records name none."""
    from specdec_utils.core.eagle import eagle_head_for, head_facts
    from specdec_utils.models import tiny_model
    head = eagle_head_for(tiny_model("tiny-llama", vocab_size=49152), seed=3)
    head.save(tmp_path / "head")
    out_file = tmp_path / "records.json"
    code, _, err = run_main(capsys, ["--target", "tiny-llama", "--methods", "ar,eagle-chain,eagle", "--eagle",
                                     str(tmp_path / "head"), "--prompts", str(prompts_file), "--max-new-tokens", "6",
                                     "--device", "cpu", "--out", str(out_file)])
    assert code == 0, err
    records = json.loads(out_file.read_text())
    facts = head_facts(head, str(tmp_path / "head"))
    assert facts["from"] == "head" and len(facts["weights_sha256"]) == 16  # no private path
    assert [r.get("eagle_head") for r in records] == [None if r["method"] == "ar" else facts for r in records]
    assert {r["method"] for r in records if "eagle_head" in r} == {"eagle-chain", "eagle"}


def test_rows_record_the_draft_weights_they_measured(capsys, prompts_file, tmp_path):
    """Each record of a method that drafts with `--draft` names that draft's weights (`models.weights_facts`: where
    from and a hash of the weights), so that a lesson can tell a run of a retrained draft from one of the draft it
    replaced under the same name; `ar` and `hf-prompt-lookup` (no draft) name none."""
    from transformers import AutoTokenizer

    from specdec_utils.models import ensure_target_cache, tiny_model, weights_facts
    tiny_model("tiny-llama", vocab_size=49152, seed=4).save_pretrained(tmp_path / "my-draft")
    AutoTokenizer.from_pretrained(ensure_target_cache()).save_pretrained(tmp_path / "my-draft")
    out_file = tmp_path / "records.json"
    argv = ["--target", "tiny-llama", "--draft", str(tmp_path / "my-draft"), "--methods",
            "ar,greedy,sampling,hf-prompt-lookup", "--prompts", str(prompts_file),
            "--max-new-tokens", "6", "--device", "cpu", "--out", str(out_file)]
    code, _, err = run_main(capsys, argv)
    assert code == 0, err
    records = json.loads(out_file.read_text())
    # and the command that measures them again, the same on every row, naming no folder of this machine
    assert {shlex.join(shlex.split(r["command"])[:3]) for r in records} == {"python -m specdec_lab.bench"}
    public = [Path(w).name if Path(w).is_absolute() else w for w in argv]  # (pytest's folders lie outside)
    assert [shlex.split(r["command"])[3:] for r in records] == [public] * len(records)
    facts = weights_facts(str(tmp_path / "my-draft"))
    assert facts["from"] == "my-draft" and len(facts["weights_sha256"]) == 16  # no private path
    drafted = {"greedy", "sampling"}
    assert [r.get("draft_weights") for r in records] == [facts if r["method"] in drafted else None for r in records]
    assert not any("draft_small_weights" in r for r in records)
    # a variant that names its own draft (run_benchmark's `drafts`, as notebooks use it) records that draft's
    from specdec_utils.models import load_model
    target, tokenizer = load_model("tiny-llama", device="cpu")
    other = tmp_path / "other-draft"
    tiny_model("tiny-llama", vocab_size=49152, seed=5).save_pretrained(other)
    rows = [{"id": "story", "prompt": "Once upon a time"}]
    mine = measure.Variant("mine", "greedy", draft=str(other))
    records = measure.run_benchmark(target, None, tokenizer, rows, ["ar", mine], 4, 2, 0.0, 1.0, 0,
                                      dtype_name="float32",
                                  device="cpu", drafts={str(other): tiny_model("tiny-llama", vocab_size=49152, seed=5)})
    assert [r.get("draft_weights") for r in records] == [None, weights_facts(str(other))]
    assert weights_facts(str(other))["weights_sha256"] != facts["weights_sha256"]


def test_tree_methods_run_from_the_command_line(capsys, prompts_file, tmp_path):
    """`--heads` (a folder of saved heads), `--tree-nodes` and `--prune` reach both tree methods; greedy
    output is the target's; records name the heads and carry the tree statistics."""
    from specdec_utils.core.medusa import MedusaHeads
    from specdec_utils.models import tiny_model
    heads = MedusaHeads(tiny_model("tiny-llama", vocab_size=49152), 3)
    heads.rank_accuracy = [[0.5, 0.2, 0.1], [0.3, 0.1, 0.05], [0.2, 0.1, 0.05]]
    heads.save(tmp_path / "heads")
    out_file = tmp_path / "trees.json"
    methods = ["ar", "medusa", "draft-tree"]
    code, out, err = run_main(capsys, ["--target", "tiny-llama", "--draft", "tiny-llama",
                                       "--methods", ",".join(methods),
                                       "--heads", str(tmp_path / "heads"), "--tree-nodes", "6", "--prune", "path",
                                       "--prompts", str(prompts_file), "--max-new-tokens", "10", "--device", "cpu",
                                       "--out", str(out_file)])
    assert code == 0, err
    records = json.loads(out_file.read_text())
    by_key = {(r["id"], r["method"]): r for r in records}
    for prompt_id in ("story", "chat"):
        for method in methods[1:]:
            record = by_key[prompt_id, method]
            assert record["new_token_ids"] == by_key[prompt_id, "ar"]["new_token_ids"]
            assert record["params"] == {"tree_nodes": 6, "prune": "path"}
            assert record["detail"]["tree_nodes"] <= 6 * record["rounds"]
            assert record["stops"].get("tree", 0) >= 1
        assert by_key[prompt_id, "medusa"]["heads"] == "heads (0 steps)"


def test_summary_table_renders_the_shared_aggregation():
    records = [{"id": p, "method": m, "new_tokens": 10, "wall_s": w, "target_calls": t, "draft_calls": d,
                "drafted": dr, "accepted": a}
               for p, m, w, t, d, dr, a in [("p1", "ar", 1.0, 10, 0, 0, 0), ("p2", "ar", 1.0, 10, 0, 0, 0),
                                            ("p1", "greedy", 0.5, 4, 12, 12, 6), ("p2", "greedy", 0.5, 5, 16, 16, 5),
                                            ("p1", "hf-prompt-lookup", 0.5, 5, 0, -1, -1),
                                            ("p2", "hf-prompt-lookup", 0.5, 5, 0, -1, -1)]]
    assert measure.tokens_per_second(records) == {"ar": 10.0, "greedy": 20.0, "hf-prompt-lookup": 20.0}
    lines = measure.summary_table(records).splitlines()
    assert lines[0].split() == ["method", "tokens/s", "tokens/target", "call", "acceptance", "wasted/token", "draft",
                                "calls/token", "speedup", "vs", "ar"]
    assert lines[1].split() == ["ar", "10.0", "1.00", "-", "0.00", "0.00", "1.00x"]
    assert lines[2].split() == ["greedy", "20.0", "2.22", "0.39", "0.85", "1.40", "2.00x"]
    assert lines[3].split() == ["hf-prompt-lookup", "20.0", "2.00", "-", "-", "0.00", "2.00x"]
    assert measure.summary_table(records[2:]).splitlines()[1].split()[-1] == "-"  # no `ar`: no speedup


def test_hf_assisted_accepts_a_reduced_vocabulary_draft():
    """Hugging Face would take our reduced-vocabulary draft for another tokenizer; the bench shows
    it the full vocabulary size during the call, and greedy output then equals greedy decoding."""
    target = tiny_model("tiny-llama", vocab_size=256).eval()
    config = LlamaConfig(vocab_size=65, full_vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(1)
    draft = ReducedVocabLlamaForCausalLM(config).eval()
    draft.set_vocab(torch.arange(0, 256, 4))
    input_ids = torch.tensor([[5, 80, 13, 200, 7]])
    settings = {"gamma": 3, "top_p": 1.0, "seed": 0, "eos_token_id": 2, "pad_token_id": 2}
    expected = autoregressive_generate(target, input_ids, 12, eos_token_id=2).new_token_ids
    result = measure.run_method("hf-assisted", target, draft, input_ids, 12, temperature=0.0, **settings)
    assert result.new_token_ids == expected
    # and HF's loop proposes what the draft itself would, from a cache that holds just the sequence: transformers
    # 5.23 drops the attention mask for a forward whose signature does not name it, and then re-fed the whole sequence
    from specdec_lab.hf_assist_check import assisted_rounds, greedy_continuation
    rounds = assisted_rounds(target, draft, input_ids, 3, 12, 2, 2)
    assert len(rounds) >= 3 and all(excess == 0 for *_, excess in rounds)
    assert all(proposal == greedy_continuation(draft, prefix, len(proposal)) for prefix, proposal, _ in rounds)
    sampled = measure.run_method("hf-assisted", target, draft, input_ids, 12, temperature=1.0, **settings)
    assert 1 <= len(sampled.new_token_ids) <= 12
    assert draft.config.vocab_size == 65  # restored after the call


@pytest.mark.slow
def test_draft_step_bench_times_wider_passes_and_whole_block_rounds(monkeypatch):
    """`step_costs.step_costs` with `verify` and `block_size`: the block drafter's entry times a whole round
    (one pass, every slot walked), each timed call once after the warm-up."""
    from specdec_utils import step_costs
    rounds = []
    propose = step_costs.BlockProposer.propose

    def spy(self, tokens, gamma, *rest):
        proposal = propose(self, tokens, gamma, *rest)
        rounds.append((gamma, len(proposal.tokens)))
        return proposal
    monkeypatch.setattr(step_costs.BlockProposer, "propose", spy)
    steps = step_costs.step_costs(torch.device("cpu"), torch.float32, context=16, repeats=2, verify=(3,),
                                     block_size=4, markov_rank=2)
    assert set(steps) == {"target", "draft-m", "eagle-head", "target x3", "block-drafter"}
    assert all(0 < s["p10_ms"] <= s["median_ms"] <= s["p90_ms"] for s in steps.values())
    assert rounds == [(3, 3)] * (20 + 2)  # 20 warm-up calls, 2 timed; every round drafts all 3 slots


@pytest.mark.slow
def test_draft_step_bench_times_the_head_eager_unless_asked_for_its_graph(monkeypatch):
    """The "eagle-head" row is the head's step eager, like the models beside it (on a GPU the proposer records its
    steps as CUDA graphs unless told not to); "eagle-head, graphed" only with graphed=True on a CUDA device."""
    from specdec_utils import step_costs
    built = []
    proposer = step_costs.EagleProposer

    def spy(head, *args, **kwargs):
        built.append(kwargs.get("graphs"))
        return proposer(head, *args, **kwargs)
    monkeypatch.setattr(step_costs, "EagleProposer", spy)
    steps = step_costs.step_costs(torch.device("cpu"), torch.float32, context=16, repeats=2, graphed=True)
    assert built == [False] and "eagle-head, graphed" not in steps  # no CUDA here: the eager row alone


@pytest.mark.slow
def test_the_bench_runs_the_block_method_with_the_shipped_drafter(capsys, tmp_path):
    """`--methods block` runs with the shipped block drafter (`--block`, beside --draft's model for the other
    methods), gives the target alone's greedy tokens in float32, and records the drafter's weights."""
    out_file = tmp_path / "block.json"
    code, _, err = run_main(capsys, ["--methods", "ar,block,draft", "--per-category", "1", "--max-new-tokens", "6",
                                     "--device", "cpu", "--out", str(out_file)])
    assert code == 0, err
    records = json.loads(out_file.read_text())
    ar = {r["id"]: r["new_token_ids"] for r in records if r["method"] == "ar"}
    block = [r for r in records if r["method"] == "block"]
    assert block and all(r["new_token_ids"] == ar[r["id"]] for r in block)
    assert {r["draft_weights"]["from"] for r in block} == {"block-drafter"}
    assert {r["draft_weights"]["from"] for r in records if r["method"] == "draft"} == {"draft-m"}
