"""Solutions to the exercises of notebook 02 (speculative sampling); `tests/test_solutions.py` checks them.

Each exercise has its code and its answer in words (the docstrings). Numeric answers are computed by the code:
run `python notebooks/solutions/ch02.py` to print them for the notebook's toy distributions.
"""
import numpy as np
import torch

from specdec_utils.exactness import chi_square_p_value
from specdec_utils.core.sampling import sample_token, warp_logits
from specdec_utils.theory import expected_accepted_length, expected_speedup

# The notebook's toy next-token distributions (section 1).
VOCAB = ["the", "a", "cat", "dog", "sat", "ran", "on", "."]
P_TOY = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.10, 0.08, 0.05, 0.02], dtype=torch.float64)
Q_TOY = torch.tensor([0.10, 0.35, 0.25, 0.05, 0.10, 0.05, 0.10, 0.00], dtype=torch.float64)


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


def first_tokens(p: torch.Tensor, q: torch.Tensor, n: int, generator: torch.Generator,
                 after_rejection: str = "residual") -> torch.Tensor:
    """n independent rounds with one draft (γ = 1), vectorized: x ~ q, keep x if u q(x) < p(x), else emit a
    draw from norm(max(0, p - q)) ("residual", the correct rule) or from p ("p", the planted bug). Returns the
    first emitted token of every round."""
    p, q = p.double(), q.double()
    drafts = torch.multinomial(q, n, replacement=True, generator=generator)
    keep = torch.rand(n, generator=generator, dtype=torch.float64) * q[drafts] < p[drafts]
    replacement_probs = (p - q).clamp(min=0) if after_rejection == "residual" else p
    replacements = torch.multinomial(replacement_probs, n, replacement=True, generator=generator)
    return torch.where(keep, drafts, replacements)


# Exercise 1 ------------------------------------------------------------------------------------
def planted_bug_emission(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Distribution of the first emitted token when a rejection draws from p instead of the residual:
    P(x) = min(p, q)(x) + β p(x), with β = 1 - Σ min(p, q).

    Answer: the output is biased **toward the draft**. Where q(x) >= p(x) (tokens the draft proposes too
    often) the residual is 0, so the correct rule never emits x after a rejection, but the bug does: those
    tokens get p(x) + β p(x), more than p(x). Tokens with p > q get q(x) + β p(x), less than p(x) where the
    draft under-proposes them by more than β p(x). The TV curve cannot fall below the bias
    TV(min(p, q) + β p, p) (`planted_bug_level`, printed by this module's main for the toy p, q): there it
    flattens. The notebook's curve is over pairs, and flattens at `planted_bug_pair_level`."""
    p, q = p.double(), q.double()
    kept = torch.minimum(p, q)
    return kept + (1 - kept.sum()) * p


def planted_bug_level(p: torch.Tensor, q: torch.Tensor) -> float:
    """TV(planted-bug output, p) for the first token: where the TV curve of exercise 1 flattens."""
    return tv(planted_bug_emission(p, q), p.double())


def toy_markov(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The notebook's toy Markov target P and draft Q (section 3): P[s, x] = p(x | previous token s)."""
    markov = torch.Generator().manual_seed(seed)
    toy_logits = 1.5 * torch.randn(len(VOCAB), len(VOCAB), generator=markov)
    return toy_logits.softmax(-1), (toy_logits + torch.randn(len(VOCAB), len(VOCAB), generator=markov)).softmax(-1)


def planted_bug_pair_level(P: torch.Tensor, Q: torch.Tensor, start: int) -> float:
    """The same level for the notebook's toy Markov model, over the first two tokens at γ = 1 (section 3's
    plot): a kept first draft x1 is followed by the bonus token, drawn from P[x1] (exact); a rejected one is
    replaced by a draw from P[start] (the bug), and the next round then repeats the bug from that token."""
    P, Q = P.double(), Q.double()
    kept_first = torch.minimum(P[start], Q[start])
    rejected_first = 1 - kept_first.sum()
    bug_rows = torch.stack([planted_bug_emission(P[s], Q[s]) for s in range(len(P))])   # next token, bug
    pairs = kept_first[:, None] * P + rejected_first * P[start][:, None] * bug_rows
    exact = P[start][:, None] * P
    return tv(pairs.flatten(), exact.flatten())


def chi_square_catches_the_bug(p: torch.Tensor, q: torch.Tensor, n: int = 10_000, seed: int = 0) -> dict:
    """Chi-square p-values of the first emitted token against p, for the correct rule and the planted bug.

    Answer: the correct rule's p-value is an ordinary draw between 0 and 1; the bug's is astronomically small
    already at a few thousand rounds (its bias is far above the noise), so the course's exactness test
    catches it. TV alone needs the eye: the bug's TV stops falling, while a correct rule's keeps falling
    like 1/√n."""
    generator = torch.Generator().manual_seed(seed)
    probs = dict(enumerate(p.double().tolist()))
    out = {}
    for name, rule in (("correct", "residual"), ("planted bug", "p")):
        tokens = first_tokens(p, q, n, generator, after_rejection=rule)
        out[name] = chi_square_p_value(_counts(tokens), probs)
    return out


def _counts(tokens: torch.Tensor) -> dict:
    from collections import Counter
    return Counter(tokens.tolist())


# Exercise 2 ------------------------------------------------------------------------------------
def match_target_sample(draft_probs: torch.Tensor, target_probs: torch.Tensor, draft_tokens: torch.Tensor,
                        generator: torch.Generator | None = None) -> torch.Tensor:
    """Rule 3 for γ drafts: at position i the target draws its own y_i ~ p_i; keep x_i if x_i == y_i and go on,
    else emit y_i and stop; if all drafts were kept, add a bonus token from p_{γ+1}.

    Why it stays exact: the token emitted at every position is the target's own draw y_i ~ p_i (when x_i is
    kept, x_i == y_i). The draft only decides whether the round goes on, never which token comes out, so the
    output is a plain sample of the target. Its price: x_i is kept only when two independent draws agree,
    with probability Σ p q, never more than α = Σ min(p, q) since p q <= min(p, q) max(p, q) <= min(p, q)."""
    for i, x in enumerate(draft_tokens.tolist()):
        y = sample_token(target_probs[i], generator)
        if y != x:
            return torch.cat([draft_tokens[:i], draft_tokens.new_tensor([y])])
    return torch.cat([draft_tokens, draft_tokens.new_tensor([sample_token(target_probs[len(draft_tokens)], generator)])])


def kept_fractions(p: torch.Tensor, q: torch.Tensor) -> dict:
    """Kept fraction of one drafted position under rule 3 (Σ p q) and under rejection sampling (Σ min(p, q)).

    Answer: on the real next token of section 5 (call it with the notebook's `p_real`, `q_real`) rule 3 keeps
    far fewer drafts than α: with p spread over hundreds of tokens, Σ p q <= max p is small, while Σ min(p, q)
    counts all the mass the two share. Look at the ratio of the two numbers."""
    p, q = p.double(), q.double()
    return {"match a target sample": (p * q).sum().item(), "rejection sampling": torch.minimum(p, q).sum().item()}


# Exercise 3 ------------------------------------------------------------------------------------
@torch.no_grad()
def mean_alpha(target, draft, token_ids: torch.Tensor, **warp) -> float:
    """Mean α_t = Σ min(p_t, q_t) along a text `token_ids` [1, n], both models warped with the same settings
    (temperature, top_k, top_p): the α that section 6's formula needs.

    Answer: α goes **up** for our distilled drafts at a temperature below 1 (the lab notebook's table,
    `notebooks/lab/02_speculative_sampling_lab.ipynb` section 1, measures it on one text; this function measures
    it along section 6's generations): a draft that ranks tokens like its target is sharpened toward the same
    tokens. A top-p cut removes the tail where the two disagree, which can raise α, but that table shows no gain
    from adding top-p 0.9 at temperature 0.7 on its text: measure it along the generations rather than assume it. A higher α predicts more tokens per pass and a larger speedup,
    (1 - α^(γ+1)) / ((1 - α)(γ c + 1)) (`predicted_speedup`). It depends on the draft: one that ranks tokens
    differently from its target can lose α when sharpened (the toy draft of section 4 does)."""
    p = warp_logits(target(input_ids=token_ids).logits[0, :-1], **warp)
    q = warp_logits(draft(input_ids=token_ids).logits[0, :-1], **warp)
    return torch.minimum(p, q).sum(-1).mean().item()


def predicted_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Leviathan et al. 2023's expected speedup at acceptance α, draft length γ and draft/target cost c."""
    return float(expected_speedup(alpha, gamma, cost_ratio))


# Exercise 4 ------------------------------------------------------------------------------------
def vocabulary_cap(p_rows: torch.Tensor, raw_draft_probs: torch.Tensor) -> torch.Tensor:
    """cap_t = Σ_{x the draft can propose} p_t(x), per row. The draft can propose x where its unwarped
    probability is above 0 (its logits for the other 40,960 target tokens sit at the dtype's minimum).

    Answer: α_t = Σ min(p_t, q_t) <= cap_t, so 1 - mean(cap_t) along the generations is the most acceptance the
    missing tokens can cost (`vocabulary_cost`). Look at it next to the mean α: the cap costs little when the
    target rarely puts mass outside the draft's vocabulary (the 8,192 most frequent tokens cover most of it),
    and it binds on rare words, names and code identifiers."""
    return (p_rows * (raw_draft_probs > 0)).sum(-1)


@torch.no_grad()
def vocabulary_cost(target, draft, token_ids: torch.Tensor, temperature: float = 1.0) -> dict:
    """Along a text [1, n]: mean α, mean cap and the most acceptance the draft's vocabulary can cost."""
    p = warp_logits(target(input_ids=token_ids).logits[0, :-1], temperature)
    draft_logits = draft(input_ids=token_ids).logits[0, :-1]
    q = warp_logits(draft_logits, temperature)
    cap = vocabulary_cap(p, warp_logits(draft_logits))
    return {"mean alpha": torch.minimum(p, q).sum(-1).mean().item(), "mean cap": cap.mean().item(),
            "largest cost": 1 - cap.mean().item()}


# Exercise 5 ------------------------------------------------------------------------------------
def lenient_rule(p: torch.Tensor, q: torch.Tensor, lam: float) -> tuple[float, float]:
    """Keep x ~ q with probability min(1, p(x) / (λ q(x))); after a rejection draw from norm(max(0, p - λ q)).
    Returns (kept fraction, TV of the emitted token to p), exactly.

    Answer: λ = 1 is rejection sampling (TV 0, kept α). As λ falls, more drafts are kept (each token keeps
    min(q, p/λ)) and the output drifts toward q: the tokens the draft over-proposes are kept more often and the
    residual no longer makes up for them. On the toy p, q both numbers grow together as λ goes 9/10, 3/4, 1/2
    (printed by main), and at λ = 1/2 = min p/q every draft is kept: the output is q itself, with TV(p, q).
    Every extra kept draft is paid for in bias, which no amount of sampling removes."""
    p, q = p.double(), q.double()
    kept = torch.minimum(q, p / lam)
    residual = (p - lam * q).clamp(min=0)
    emitted = kept + (1 - kept.sum()) * residual / residual.sum()
    return kept.sum().item(), tv(emitted, p)


def lenient_first_tokens(p: torch.Tensor, q: torch.Tensor, lam: float, n: int, generator: torch.Generator):
    """The lenient rule sampled n times (γ = 1): the empirical check of `lenient_rule`."""
    p, q = p.double(), q.double()
    drafts = torch.multinomial(q, n, replacement=True, generator=generator)
    keep = torch.rand(n, generator=generator, dtype=torch.float64) * lam * q[drafts] < p[drafts]
    replacements = torch.multinomial((p - lam * q).clamp(min=0), n, replacement=True, generator=generator)
    tokens = torch.where(keep, drafts, replacements)
    return tokens, keep.double().mean().item()


# Exercise 6 ------------------------------------------------------------------------------------
def simulate_tokens_per_pass(alpha_rows, gamma: int, seed: int = 0, repeats: int = 200) -> float:
    """Simulate speculative rounds along measured α_t: `alpha_rows` holds one 1-D tensor of α_t per generation
    (its length is the generation's length, so the budget is the same). A round starting at position t drafts
    k = min(γ, remaining - 1) tokens, keeps draft i with probability α_{t+i} until the first rejection, and
    emits the kept drafts plus one token. Returns total tokens / total rounds over `repeats` replays.

    Answer: compare, per γ, four numbers: the formula at the mean α (one α, no budget), this simulation with
    every α_t replaced by the mean (`constant=True` in `gap_decomposition`: adds only the budget), this
    simulation along the measured α_t (adds α's variation and correlation along the text), and the measurement.
    The largest of the three steps is the assumption that accounts for most of the gap. The budget's step grows
    with γ and shrinks with longer generations; the step to the measured α_t is what the lab notebook's section 3 measures
    (hard first positions pull down, easy runs push up); what is left between the simulation and the measurement
    is the part the α_t of the realized text cannot replay (rounds start right after a surprise of the target's)."""
    rng = np.random.default_rng(seed)
    tokens = rounds = 0
    rows = [np.asarray(a, dtype=np.float64) for a in alpha_rows]
    for _ in range(repeats):
        for alphas in rows:
            n, t = len(alphas), 0
            while t < n:
                k = min(gamma, n - t - 1)
                kept = 0
                while kept < k and rng.random() < alphas[t + kept]:
                    kept += 1
                t += kept + 1
                tokens, rounds = tokens + kept + 1, rounds + 1
    return tokens / rounds


def gap_decomposition(alpha_rows, gamma: int, measured: float, seed: int = 0, repeats: int = 200) -> dict:
    """The four numbers of exercise 6 for one draft and γ (see `simulate_tokens_per_pass`)."""
    mean_alpha_all = float(np.mean(np.concatenate([np.asarray(a, dtype=np.float64) for a in alpha_rows])))
    constant = [np.full(len(a), mean_alpha_all) for a in alpha_rows]
    return {"formula": float(expected_accepted_length(mean_alpha_all, gamma)),
            "simulated, constant α with the budget": simulate_tokens_per_pass(constant, gamma, seed, repeats),
            "simulated along the measured α_t": simulate_tokens_per_pass(alpha_rows, gamma, seed, repeats),
            "measured": measured}


if __name__ == "__main__":
    print(f"1. planted bug: TV of the first token flattens at {planted_bug_level(P_TOY, Q_TOY):.3f}; "
          f"chi-square p-values {chi_square_catches_the_bug(P_TOY, Q_TOY)}; section 3's pair curve flattens at "
          f"{planted_bug_pair_level(*toy_markov(), start=0):.3f}")
    print(f"2. kept fractions on the toy p, q: {kept_fractions(P_TOY, Q_TOY)}")
    for lam in (1.0, 9 / 10, 3 / 4, 1 / 2):
        kept, distance = lenient_rule(P_TOY, Q_TOY, lam)
        print(f"5. lenient λ = {lam:.2f}: keeps {kept:.3f} of the drafts, TV to p {distance:.3f}")
