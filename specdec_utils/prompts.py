"""The course's prompt set, written by the project (no hub data sets offline).

Five categories (facts, lists, stories, code, instructions), each built from templates and
fillers. Training and evaluation prompts use disjoint fillers, so evaluation is held out.
`python -m specdec_utils.prompts` rewrites `data/prompts/{train,eval}.jsonl` deterministically.
"""
from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

from .utils import REPO_ROOT

PROMPTS_DIR = REPO_ROOT / "data" / "prompts"
CATEGORIES = ("facts", "lists", "stories", "code", "instructions")

# Each category: templates with one {x} slot, and fillers split into train and eval.
TEMPLATES = {
    "facts": ["The capital of {x} is", "Here are some facts about {x}:", "{x} is known for",
              "Q: What is {x} famous for?\nA:", "The history of {x} begins", "In short, {x} is"],
    "lists": ["Here is a list of five things to pack for {x}:\n1.", "Top 3 reasons to visit {x}:\n1.",
              "Ingredients you need for {x}:\n-", "Steps to learn {x}:\n1.", "Common mistakes in {x}:\n-"],
    "stories": ["Once upon a time, {x}", "The old lighthouse keeper said that {x}",
                "It was a cold morning when {x}", "Chapter 1. {x}", "Nobody believed me when I said {x}"],
    "code": ["def {x}(", "# Python function to {x}\ndef", "```python\n# {x}\n",
             "class {x}:\n    \"\"\"", "// JavaScript: {x}\nfunction"],
    "instructions": ["Explain {x} in simple terms.", "Write a short poem about {x}.",
                     "Give me three tips for {x}.", "What are the pros and cons of {x}?",
                     "Summarize the idea of {x} in two sentences.", "How do I get started with {x}?"],
}

FILLERS = {
    "facts": {
        "train": ["France", "Japan", "Brazil", "Canada", "Egypt", "Germany", "India", "Kenya", "Mexico",
                  "Norway", "Peru", "Spain", "Italy", "Australia", "China", "Greece", "Turkey", "Chile",
                  "the Moon", "Mars", "the Amazon river", "Mount Everest", "the Sahara", "Jupiter",
                  "the Pacific Ocean", "Antarctica", "Paris", "Tokyo", "London", "Rome", "Cairo",
                  "Albert Einstein", "Marie Curie", "Isaac Newton", "Leonardo da Vinci", "Ada Lovelace",
                  "the Roman Empire", "the printing press", "photosynthesis", "the human heart", "DNA"],
        "eval": ["Portugal", "Vietnam", "Argentina", "Sweden", "the Nile", "Saturn", "Berlin",
                 "Charles Darwin", "the steam engine", "volcanoes"],
    },
    "lists": {
        "train": ["a beach holiday", "a camping trip", "a ski weekend", "a business trip", "Iceland",
                  "New York", "Kyoto", "pancakes", "lasagna", "guacamole", "banana bread", "tomato soup",
                  "the guitar", "chess", "Spanish", "programming", "painting", "public speaking",
                  "gardening", "cooking rice", "writing essays", "running a marathon", "investing",
                  "Barcelona", "a picnic", "a wedding", "chocolate cake", "a hiking trip", "yoga"],
        "eval": ["a road trip", "Lisbon", "apple pie", "the piano", "swimming", "photography"],
    },
    "stories": {
        "train": ["a little fox found a golden key", "a robot wanted to learn how to paint",
                  "the king lost his crown in the river", "two friends built a boat",
                  "a dragon was afraid of the dark", "the village ran out of water",
                  "a girl could talk to birds", "the train never arrived", "a cat became the mayor",
                  "the stars went out one by one", "an old man planted a tree",
                  "a young wizard missed the exam", "the bakery opened at midnight",
                  "a mouse lived in the library", "the ship sailed to the edge of the map",
                  "a boy found a map in the attic", "the snow fell in July", "a clock ran backwards"],
        "eval": ["a turtle wanted to fly", "the lights in the city turned green",
                 "a painter lost her colours", "a knight refused to fight"],
    },
    "code": {
        "train": ["reverse a string", "check if a number is prime", "compute the factorial",
                  "merge two sorted lists", "count words in a text", "read a CSV file",
                  "find the maximum of a list", "flatten a nested list", "binary search",
                  "compute fibonacci numbers", "remove duplicates", "parse a date", "sort a dictionary by value",
                  "is_palindrome", "gcd", "bubble_sort", "Stack", "LinkedList", "BankAccount", "Matrix",
                  "load_json", "normalize_vector", "moving_average", "word_frequencies", "Counter"],
        "eval": ["compute the median", "rotate a list", "Queue", "celsius_to_fahrenheit",
                 "capitalize each word", "TemperatureSensor"],
    },
    "instructions": {
        "train": ["machine learning", "photosynthesis", "gravity", "inflation", "the internet",
                  "climate change", "recursion", "the stock market", "vaccines", "black holes",
                  "democracy", "sleep", "meditation", "learning a language", "saving money",
                  "working from home", "electric cars", "healthy eating", "time management",
                  "the ocean", "friendship", "autumn", "coffee", "cities at night", "exercise"],
        "eval": ["solar power", "the water cycle", "encryption", "public transport", "volunteering",
                 "rain"],
    },
}

CHAT_CATEGORIES = ("instructions",)  # asked through the chat template; the others are raw completions


def build_prompts(split: str) -> list[dict]:
    """All prompts of `split` ('train' or 'eval') as dicts {id, category, prompt, chat}."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    rows = []
    for category in CATEGORIES:
        pairs = itertools.product(TEMPLATES[category], FILLERS[category][split])
        for i, (template, filler) in enumerate(pairs):
            rows.append({"id": f"{split}-{category}-{i:03d}", "category": category,
                         "prompt": template.format(x=filler), "chat": category in CHAT_CATEGORIES})
    return rows


def eval_subset(per_category: int = 2, seed: int = 0) -> list[dict]:
    """A small, fixed, category-balanced slice of the eval prompts for notebooks and benchmarks."""
    rows = build_prompts("eval")
    rng = random.Random(seed)
    out = []
    for category in CATEGORIES:
        pool = [r for r in rows if r["category"] == category]
        out += rng.sample(pool, min(per_category, len(pool)))
    return out


def load_prompts(path) -> list[dict]:
    """Read a JSONL prompts file: one {"id": ..., "prompt": ...} per line (other keys optional)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompts file {path} does not exist")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict) or "prompt" not in row or "id" not in row:
            raise ValueError(f"{path}:{n}: each line needs an object with 'id' and 'prompt'")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no prompts")
    return rows


def format_prompt(tokenizer, row: dict) -> str:
    """The text the model sees: chat prompts go through the tokenizer's chat template."""
    if row.get("chat") and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}],
                                             tokenize=False, add_generation_prompt=True)
    return row["prompt"]


def write_prompt_files(directory: Path = PROMPTS_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for split in ("train", "eval"):
        with open(directory / f"{split}.jsonl", "w") as f:
            for row in build_prompts(split):
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    write_prompt_files()
    print({s: len(build_prompts(s)) for s in ("train", "eval")})
