"""Solutions to the exercises of notebook 01 (greedy speculative decoding); `tests/test_solutions.py` checks them.

Measured answers depend on the machine, so the code computes them; each function's docstring says the answer
in words and what to look at. In notebook 01, pass its models, `prompt_ids`, `step_ms`, `verify_ms` and its
`greedy_speculative_generate`.
"""
from __future__ import annotations

import torch

from specdec_utils.measure import ForwardCounter
from specdec_utils.core.kv_cache import trim_cache
from specdec_utils.speculative import autoregressive_generate, forward_uncached, speculative_generate
from specdec_utils.theory import expected_accepted_length


# Exercise 1 ------------------------------------------------------------------------------------
def refined_speedup(alpha: float, gamma: int, t_target: float, t_draft: float, t_verify: dict) -> float:
    """Section 6's refined prediction: E[tokens per round] T(1) / (gamma T_draft + T(gamma + 1))."""
    return float(expected_accepted_length(alpha, gamma)) * t_target / (gamma * t_draft + t_verify[gamma + 1])


def best_draft(drafts: dict, t_target: float, t_verify: dict, gammas=range(1, 9)) -> dict:
    """For each draft {name: (alpha, t_draft)}: its best gamma and refined predicted speedup; plus 'winner'.
    `t_verify` maps k to T(k) for k = 1 .. 9: the notebook measures k = 1 and gamma + 1, so time the others with
    its `forward_ms(models[dtype][TARGET], k)`.

    Answer: the draft with the larger refined prediction should win, and neither alpha nor c decides alone:
    `draft-s` costs a bit over half as much per step; on the notebook's few prompts it can reach the same
    alpha and tau as `draft-m` (section 5), and then it wins at every gamma by its lower c; the trade-off
    appears where `draft-m` is accepted more often (the training logs' evaluation on all held-out prompts
    gives `draft-m` the higher tau). Because a round's
    verification pass costs the same for both drafts, the cheaper draft gains most at large gamma, where
    draft steps are a large part of the round; the better draft gains most at small gamma, where acceptance
    decides. Run section 6 with `DRAFT = "draft-s"` (the lab page's sweep covers every gamma): if the two
    measured intervals overlap, the honest answer is a tie. The formula's ranking agrees with the measurement only
    where the verification pass costs about one target step (bfloat16 with bfloat16 instructions)."""
    result = {}
    for name, (alpha, t_draft) in drafts.items():
        gamma = max(gammas, key=lambda g: refined_speedup(alpha, g, t_target, t_draft, t_verify))
        result[name] = (gamma, refined_speedup(alpha, gamma, t_target, t_draft, t_verify))
    result["winner"] = max(drafts, key=lambda name: result[name][1])
    return result


# Exercise 2 ------------------------------------------------------------------------------------
def count_passes(generate_fn, target, draft, input_ids, max_new_tokens: int, gamma: int) -> dict:
    """Forward passes of both models in one `generate_fn(target, draft, input_ids, max_new_tokens, gamma)`
    call (notebook 01's `greedy_speculative_generate`), and the tokens each draft pass was fed.

    Answer: the target makes one pass per round (its first pass also prefills the prompt); the draft makes
    gamma passes per round (fewer near the end of the budget). The draft's first pass of a round feeds one
    token after a rejection (the target's correction: the rolled-back cache holds everything else) and two
    tokens after a fully accepted round: the draft never saw its own last proposal (it is proposed by the
    last pass, not fed to one) nor the target's bonus token. The first round's first pass feeds the whole
    prompt (the prefill)."""
    fed = []
    handle = draft.register_forward_pre_hook(lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]),
                                             with_kwargs=True)
    target_counter, draft_counter = ForwardCounter(target), ForwardCounter(draft)
    try:
        new_ids, rounds = generate_fn(target, draft, input_ids, max_new_tokens, gamma)
    finally:
        handle.remove()
        target_counter.remove()
        draft_counter.remove()
    first_of_round, position = [], 0
    for drafted, _ in rounds:
        first_of_round.append(fed[position] if drafted else 0)
        position += drafted
    return {"target_passes": target_counter.calls, "draft_passes": draft_counter.calls, "rounds": rounds,
            "first_pass_tokens": first_of_round, "new_ids": new_ids}


# Exercise 3 ------------------------------------------------------------------------------------
def self_draft(target, input_ids, max_new_tokens: int, gamma: int) -> dict:
    """Speculative decoding with the target as its own draft: tau and the output.

    Answer: every draft is accepted (in float32; in a 16-bit dtype a few near-ties between the 1-row draft pass
    and the wide verification pass are rejected, the sidebar of section 6), so each round makes gamma + 1 tokens
    (tau = gamma + 1, less only in a last, shortened round). It is still slower than plain decoding: a round costs gamma full target steps
    to draft plus one verification pass over gamma + 1 tokens, to make gamma + 1 tokens, so its time per
    token is `self_draft_slowdown(gamma, T(gamma + 1) / T(1))` >= 1 times plain decoding's. A round has a
    fixed price (the draft steps and the wider pass); speculation pays only when drafting is cheap (small c)."""
    result = speculative_generate(target, target, input_ids, max_new_tokens, gamma=gamma)
    return {"tau": len(result.new_token_ids) / result.target_calls, "new_token_ids": result.new_token_ids,
            "same_as_plain": result.new_token_ids == autoregressive_generate(target, input_ids, max_new_tokens).new_token_ids}


def self_draft_slowdown(gamma: int, verify_ratio: float) -> float:
    """Time per token of self-drafting over plain decoding: (gamma + T(gamma+1)/T(1)) / (gamma + 1)."""
    return (gamma + verify_ratio) / (gamma + 1)


# Exercise 4 ------------------------------------------------------------------------------------
def prompt_lookup_propose(tokens: list, gamma: int, ngram: int = 2) -> list:
    """The tokens that followed the last earlier occurrence of the current last `ngram` tokens (at most
    `gamma` of them); [] when that n-gram never occurred before."""
    if len(tokens) <= ngram:
        return []
    key = tokens[-ngram:]
    for start in range(len(tokens) - ngram - 1, -1, -1):
        if tokens[start:start + ngram] == key:
            return tokens[start + ngram:start + ngram + gamma]
    return []


@torch.inference_mode()
def prompt_lookup_generate(target, input_ids, max_new_tokens: int, gamma: int = 4, ngram: int = 2,
                           eos_token_id=None) -> tuple[list, list]:
    """Greedy speculative decoding with a prompt-lookup draft (no draft model): returns the new ids and,
    per round, (tokens drafted, tokens accepted).

    Answer: the output is identical to the target's greedy output (verification is the same as in
    `greedy_round`, whatever proposes the tokens). The draft costs no forward pass (c = 0), so every accepted
    token is pure gain. On a prompt that asks to repeat or edit a given text, long copied spans are proposed
    and accepted whole, and acceptance is high; on free writing the n-gram rarely recurs, few tokens are
    proposed, and the rounds become plain decoding steps."""
    tokens, cache, new_ids, rounds = input_ids, None, [], []
    while len(new_ids) < max_new_tokens and eos_token_id not in new_ids:
        room = max_new_tokens - len(new_ids) - 1
        proposal = prompt_lookup_propose(tokens[0].tolist(), min(gamma, room), ngram) if room > 0 else []
        candidate = torch.cat([tokens, tokens.new_tensor([proposal])], dim=1) if proposal else tokens
        logits, cache = forward_uncached(target, candidate, cache, len(proposal) + 1)
        choice = logits.argmax(-1)
        drafted = torch.tensor(proposal, dtype=choice.dtype)
        accepted = int((drafted == choice[:len(proposal)]).long().cumprod(0).sum()) if proposal else 0
        cache = trim_cache(cache, tokens.shape[1] + accepted)
        round_ids = choice[:accepted + 1].tolist()
        if eos_token_id in round_ids:
            round_ids = round_ids[:round_ids.index(eos_token_id) + 1]
        new_ids += round_ids
        rounds.append((len(proposal), accepted))
        tokens = torch.cat([tokens, tokens.new_tensor([round_ids])], dim=1)
    return new_ids, rounds


# Exercise 5 ------------------------------------------------------------------------------------
def bf16_flips(target, draft, prompts: list, gamma: int, max_new_tokens: int, eos_token_id=None) -> list:
    """First position where bfloat16 speculative decoding differs from bfloat16 plain decoding, per
    prompt (None where they agree). Pass the 16-bit models (bfloat16, or float16 on a GPU without it).

    Answer: the count need not grow with gamma. Every verification pass carries at least two rows, so it
    already runs different kernels and another summation order than a one-row decoding step; a flip needs a
    near-tie in the text that meets such a rounding difference. Larger gamma puts more positions into wide
    passes and changes the rounding at each, so the count can change, but it is bounded by the number of
    near-ties, and on a handful of prompts the differences between gamma = 1 and gamma = 8 are noise.
    Count over many prompts before concluding."""
    flips = []
    for input_ids in prompts:
        ours = speculative_generate(target, draft, input_ids, max_new_tokens, gamma=gamma,
                                    eos_token_id=eos_token_id).new_token_ids
        plain = autoregressive_generate(target, input_ids, max_new_tokens, eos_token_id=eos_token_id).new_token_ids
        differ = [i for i, (x, y) in enumerate(zip(ours, plain)) if x != y]
        flips.append(differ[0] if differ else (None if len(ours) == len(plain) else min(len(ours), len(plain))))
    return flips


# Exercise 6 ------------------------------------------------------------------------------------
def speedup_at_length(target, draft, tokenizer, rows: list, max_new_tokens: int, gamma: int = 4, device="cpu"):
    """The bench's speedup of `draft` (greedy at temperature 0) over `ar` (paired bootstrap over prompts) and tau,
    at a token budget.

    Answer: as the KV cache grows, attention's share of each step grows, for the target's verification pass
    and its plain steps alike, so the ratio between them changes little for a 135M model at a few hundred
    tokens: the weights still dominate a step. What changes more is the text: a small model's long
    generations repeat themselves, which a draft predicts well, so tau and the speedup can rise on the
    prompts that loop. Compare the two intervals: overlapping intervals mean no measurable change."""
    from specdec_utils import report
    from specdec_utils import measure
    records = measure.run_benchmark(target, draft, tokenizer, rows, ["ar", "draft"], max_new_tokens, gamma,
                                  temperature=0.0, top_p=1.0, seed=0, dtype_name=str(target.dtype), device=device)
    return report.speedup(records, "draft"), report.tau(records, "draft")


# The answers in words, by exercise number (each is the docstring of the function that computes it).
ANSWERS = {1: best_draft.__doc__, 2: count_passes.__doc__, 3: self_draft.__doc__, 4: prompt_lookup_generate.__doc__,
           5: bf16_flips.__doc__, 6: speedup_at_length.__doc__}
