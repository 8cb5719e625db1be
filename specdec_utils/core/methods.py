"""`generate`: the course's one public entry point. A method name picks the engine's parts
(`engine.py`: a proposer; `policies.py`: a drafting policy); the bench CLI takes the same names.

| method | proposer | policy |
|---|---|---|
| `ar` | none: the target alone | - |
| `greedy`, `sampling` | the draft model | fixed gamma (the temperature decides greedy or sampled) |
| `adaptive-hf`, `adaptive-dual`, `oracle` | the draft model | gamma chosen per round (notebook 03) |
| `entropy-stop`, `confidence-stop`, `adaedl`, `learned-stop` | the draft model | stop per token (notebook 04) |
| `hierarchical`, `hierarchical-noloop` | `draft_small` (M1) pre-verified by `draft` (M2) | per level (notebook 05) |
| `medusa` | Medusa `heads` on the target: a token tree | tree template, size, pruning (notebook 06) |
| `draft-tree` | the draft model grows a token tree | width, size, pruning (notebook 06) |
"""
from __future__ import annotations

import inspect

from . import hierarchy

from . import policies

from . import tree_drafting
from .engine import DraftModelProposer, GenerationResult, NoDraft, Sampler, as_id_set, check_arguments, decode

POLICIES = {
    "ar": policies.DraftingPolicy,
    "greedy": policies.DraftingPolicy,
    "sampling": policies.DraftingPolicy,
    "adaptive-hf": policies.HeuristicGamma,
    "adaptive-dual": policies.DualSignalGamma,
    "oracle": policies.Oracle,
    "entropy-stop": policies.EntropyStop,
    "confidence-stop": policies.ConfidenceStop,
    "adaedl": policies.AdaEDL,
    "learned-stop": policies.LearnedStop,
    "hierarchical": hierarchy.HierarchyPolicy,
    "hierarchical-noloop": hierarchy.NoLoopPolicy,
    "medusa": tree_drafting.MedusaPolicy,
    "draft-tree": tree_drafting.DraftTreePolicy,
}
METHODS = tuple(POLICIES)
GREEDY_ONLY = ("oracle",)
HIERARCHICAL = ("hierarchical", "hierarchical-noloop")
TREES = ("medusa", "draft-tree")


def make_proposer(what: str, draft, draft_small, hierarchical: bool = False, kind: str = "chain",
                  heads=None, target=None):
    """The proposer for `what` ("method 'greedy'", "policy 'mine'"): the draft model, or
    (hierarchical) `draft_small` under `draft`, or (kind "medusa" / "draft-tree") a tree proposer."""
    if kind == "medusa":
        if not isinstance(heads, tree_drafting.MedusaHeads):
            raise ValueError(f"{what} needs heads=... (Medusa heads: specdec_utils.core.medusa.load_heads('medusa-heads', "
                             f"target)), got {type(heads).__name__}")
        if heads.target is not target:
            raise ValueError(f"{what}: these heads are attached to another target object; load them for this one: "
                             f"load_heads(name, target)")
        return tree_drafting.MedusaProposer(heads)
    if kind == "draft-tree":
        if draft is None or isinstance(draft, hierarchy.NgramDraft) or not callable(draft):
            raise ValueError(f"{what} needs draft=... a transformers draft model (it runs tree-masked forwards), "
                             f"got {type(draft).__name__}")
        return tree_drafting.DraftTreeProposer(draft)
    if draft is None:
        raise ValueError(f"{what} needs a draft model: pass draft=...")
    if not hierarchical:
        return DraftModelProposer(draft)
    if draft_small is None:
        raise ValueError(f"{what} needs draft_small=... (M1, the fastest level: a draft model or an n-gram "
                         f"table) under draft=... (M2)")
    if not (isinstance(draft_small, hierarchy.NgramDraft) or callable(draft_small)):
        raise ValueError(f"draft_small must be a model or an n-gram table (specdec_utils.core.ngram.NgramDraft), got "
                         f"{type(draft_small).__name__} {draft_small!r:.60}")
    small_vocab, middle_vocab = _output_vocab(draft_small), _output_vocab(draft)
    if None not in (small_vocab, middle_vocab) and small_vocab != middle_vocab:
        raise ValueError(f"draft_small and draft must share the output vocabulary, got {small_vocab} and "
                         f"{middle_vocab} token ids")
    return hierarchy.HierarchicalProposer(draft_small, draft)


def _output_vocab(model) -> int | None:
    """Token ids a model (or n-gram table) outputs: a reduced-vocabulary draft reports its full size."""
    config = getattr(model, "config", None)
    return getattr(config, "full_vocab_size", None) or getattr(config, "vocab_size", None)


def policy_parameters(method: str) -> list[str]:
    """The parameters a method's policy takes through `params` (gamma comes separately)."""
    signature = inspect.signature(POLICIES[method].__init__)
    return [name for name in signature.parameters if name not in ("self", "gamma")]


def make_policy(method: str, gamma: int, params: dict | None, draft=None) -> policies.DraftingPolicy:
    """The policy of `method`, with `params` checked against what it takes."""
    params = dict(params or {})
    allowed = policy_parameters(method)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r} for method {method!r}; allowed: "
                         f"{', '.join(allowed) if allowed else 'none'}")
    if method == "learned-stop":
        params.setdefault("draft", draft)
    return POLICIES[method](gamma, **params)


def generate(target, input_ids, max_new_tokens: int, method: str = "greedy", draft=None, draft_small=None,
             heads=None, gamma: int = 4, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             eos_token_id=None, generator=None, params: dict | None = None) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `input_ids` [1, n] with `method` (see the table in
    this module's docstring), through the one decode loop `engine.decode`. `method` may also be a
    `policies.DraftingPolicy` object of your own (fresh for each call: policies keep state), run
    with the draft model.

    temperature 0 is greedy: every method's output equals the target's own greedy output. Otherwise
    tokens are sampled from the target's distribution warped by temperature, top_k and top_p,
    exactly, for every method (rejection sampling). `gamma` is the fixed draft length (`greedy`,
    `sampling`), the starting one (`adaptive-*`), or unused (stopping policies cap a round with their
    `max_gamma` parameter), or the tree's depth (`medusa`, `draft-tree`). `params` holds a policy's own parameters, e.g. `{"tau": 2.0}` for
    `entropy-stop`; `policy_parameters(method)` lists them. `hierarchical*` drafts with `draft_small`
    (M1: a draft model or an `ngram.NgramDraft`) pre-verified by `draft` (M2); `medusa` guesses a
    token tree with `heads` (`medusa.load_heads`), `draft-tree` grows one with `draft`. Arguments a
    method does not use (`draft` for `ar` and `medusa`, `draft_small` outside `hierarchical*`,
    `heads` outside `medusa`) are accepted and ignored. Stops after
    `max_new_tokens` tokens or after `eos_token_id` (an id or a collection of ids). Returns a
    `GenerationResult` whose `rounds` hold per-round statistics.
    """
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"params must be a dict of the policy's parameters, e.g. {{'tau': 2.0}}, got {params!r}")
    if isinstance(method, policies.DraftingPolicy):  # your own policy object, with the draft model
        policy, method = method, method.name
        kind = ("medusa" if isinstance(policy, tree_drafting.MedusaPolicy) else
                "draft-tree" if isinstance(policy, tree_drafting.DraftTreePolicy) else "chain")
        proposer = make_proposer(f"policy {method!r}", draft, draft_small,
                                 isinstance(policy, hierarchy.HierarchyPolicy), kind, heads, target)
        if params:
            raise ValueError(f"params are for a method name; a policy object ({method!r}) takes its parameters "
                             f"in its constructor")
        check_arguments(input_ids, max_new_tokens, temperature, top_k, top_p)
        if method in GREEDY_ONLY and temperature != 0:
            raise ValueError(f"policy {method!r} is greedy only (it reads the target's greedy output); "
                             f"got temperature {temperature!r}, allowed: 0")
        return decode(target, proposer, policy, input_ids, max_new_tokens,
                      Sampler(temperature, top_k, top_p), as_id_set(eos_token_id), generator, method)
    if not isinstance(method, str) or method not in POLICIES:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}, or a DraftingPolicy object")
    if method == "ar" and params:
        raise ValueError(f"method 'ar' takes no params, got {sorted(params)}")
    check_arguments(input_ids, max_new_tokens, temperature, top_k, top_p, None if method == "ar" else gamma)
    if method in GREEDY_ONLY and temperature != 0:
        raise ValueError(f"method {method!r} is greedy only (it reads the target's greedy output); "
                         f"got temperature {temperature!r}, allowed: 0")
    if method == "ar":
        proposer, policy = NoDraft(), policies.DraftingPolicy(0)
    else:
        kind = method if method in TREES else "chain"
        proposer = make_proposer(f"method {method!r}", draft, draft_small, method in HIERARCHICAL, kind, heads, target)
        policy = make_policy(method, gamma, params, draft)
    return decode(target, proposer, policy, input_ids, max_new_tokens, Sampler(temperature, top_k, top_p),
                  as_id_set(eos_token_id), generator, method)
