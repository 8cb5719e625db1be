"""`generate`: the course's one public entry point, and the registry of its methods.

A method is a pair of parts for the engine's loop (`engine.decode`): a proposer (who drafts) and a
drafting policy (how much), plus the verifier the policy asks for. The registry names them; the bench
CLI takes the same names. `gamma` means one thing everywhere: the most draft tokens along any one path
of a round (a chain's length; a tree's depth, while the tree itself may hold more nodes); None takes the method's
default.

| method | proposer | policy | default gamma |
|---|---|---|---|
| `ar` | none: the target alone | - | - |
| `draft` | the draft model | fixed gamma (the temperature decides greedy or sampled) | 4 |
| `adaptive-hf` | the draft model | HF's heuristic, from `start` (notebook 03) | no cap |
| `adaptive-dual` | the draft model | acceptance and entropy, from `start` (notebook 03) | 8 |
| `oracle` | the draft model | knows the target's greedy answer (greedy only) | 16 |
| `entropy-stop`, `confidence-stop`, `adaedl`, `learned-stop` | the draft model | stop per token (notebook 04) | 10 |
| `hierarchical`, `hierarchical-noloop` | `draft_small` (M1) checked by `draft` (M2) | per level (notebook 05) | 10 |
| `medusa` | Medusa `heads` on the target: a token tree | tree template, size, pruning (notebook 06) | 4 |
| `draft-tree` | the draft model grows a token tree | width, size, pruning (notebook 06) | 4 |
| `eagle-chain` | an EAGLE head on the target's features: a chain | fixed gamma (notebook 07) | 5 |
| `eagle` | an EAGLE head grows EAGLE-2's dynamic tree | width, size (notebook 07) | 6 |
| `block` | a block drafter (DFlash): a block of drafts from one pass | the first gamma of the block | 7 |
| `block-confidence` | the same block drafter | as much of the block as its confidence pays for | 7 |

`register(Method(...))` adds a method of your own. `greedy` and `sampling`, the names `draft` had before, still
work (`ALIASES`; a result keeps the name it was asked by, as the benchmarks record it).
"""
from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from . import block, hierarchy, policies, tree_drafting
from . import eagle as eagle_heads
from .engine import DraftModelProposer, GenerationResult, NoDraft, Sampler, as_id_set, check_arguments, decode
from .runner import ModelRunner
from .verify import TypicalVerifier, Verifier


@dataclass(frozen=True)
class Method:
    """A named method: `make_proposer(models, what)` builds its proposer from the models passed to
    `generate` (a dict with "target", "draft", "draft_small", "heads", "eagle"); `policy` is its policy class
    (its parameters come from `params`); `uses` names the models it reads; `greedy_only` methods
    refuse a temperature."""
    name: str
    make_proposer: Callable
    policy: type
    uses: frozenset = field(default_factory=frozenset)
    greedy_only: bool = False


def _draft_model(models, what):
    draft = models["draft"]
    if draft is None:
        raise ValueError(f"{what} needs a draft model: pass draft=...")
    return DraftModelProposer(draft)


def _hierarchy(models, what):
    draft, small = models["draft"], models["draft_small"]
    if draft is None:
        raise ValueError(f"{what} needs a draft model: pass draft=...")
    if small is None:
        raise ValueError(f"{what} needs draft_small=... (M1, the fastest level: a draft model or an n-gram "
                         f"table) under draft=... (M2)")
    if not (isinstance(small, (hierarchy.NgramDraft, ModelRunner)) or callable(small)):
        raise ValueError(f"draft_small must be a model or an n-gram table (specdec_utils.core.ngram.NgramDraft), got "
                         f"{type(small).__name__} {small!r:.60}")
    small_vocab, middle_vocab = _output_vocab(small), _output_vocab(draft)
    if None not in (small_vocab, middle_vocab) and small_vocab != middle_vocab:
        raise ValueError(f"draft_small and draft must share the output vocabulary, got {small_vocab} and "
                         f"{middle_vocab} token ids")
    return hierarchy.HierarchicalProposer(small, draft)


def _medusa(models, what):
    heads, target = models["heads"], _model(models["target"])
    if not isinstance(heads, tree_drafting.MedusaHeads):
        raise ValueError(f"{what} needs heads=... (Medusa heads: specdec_utils.core.medusa.load_heads('medusa-heads', "
                         f"target)), got {type(heads).__name__}")
    if heads.target is not target:
        raise ValueError(f"{what}: these heads are attached to another target object; load them for this one: "
                         f"load_heads(name, target)")
    return tree_drafting.MedusaProposer(heads)


def _draft_tree(models, what):
    draft = models["draft"]
    usable = callable(draft) or isinstance(draft, ModelRunner)
    if draft is None or isinstance(draft, hierarchy.NgramDraft) or not usable:
        raise ValueError(f"{what} needs draft=... a transformers draft model (it runs tree-masked forwards), "
                         f"got {type(draft).__name__}")
    return tree_drafting.DraftTreeProposer(draft)


# target -> the shipped head loaded for it; the head holds its target weakly, so the entry goes with the target
_SHIPPED_EAGLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _eagle_head(models, what):
    head, target = models["eagle"], _model(models["target"])
    if head is None:  # the shipped head, loaded once per target object
        head = _SHIPPED_EAGLE.get(target)
        if head is None:
            try:
                head = eagle_heads.load_eagle(eagle_heads.EAGLE_NAME, target)
            except ValueError as err:
                raise ValueError(f"{what}: {err}; for another target pass eagle=... (an untrained head: "
                                 f"specdec_utils.core.eagle.eagle_head_for(target))") from None
            head.hold_target_weakly()  # a value holding its key strongly would keep the entry forever
            _SHIPPED_EAGLE[target] = head
    if not isinstance(head, eagle_heads.EagleHead):
        raise ValueError(f"{what} needs eagle=... an EAGLE head (specdec_utils.core.eagle.load_eagle('eagle-head', "
                         f"target) or eagle_head_for(target)), got {type(head).__name__}")
    if head.target is not target:
        raise ValueError(f"{what}: this EAGLE head is attached to another target object; build or load it for "
                         f"this one: load_eagle(name, target)")
    return head


def _eagle_chain(models, what):
    return eagle_heads.EagleProposer(_eagle_head(models, what), tree=False)


def _eagle_tree(models, what):
    return eagle_heads.EagleProposer(_eagle_head(models, what), tree=True)


def _block(models, what):
    drafter = models["draft"]
    if not isinstance(drafter, block.BlockDrafter):
        raise ValueError(f"{what} needs draft=... a block drafter (specdec_utils.core.block.block_drafter_for(target) "
                         f"or a trained one), got {type(drafter).__name__}")
    return block.BlockProposer(drafter)


def _model(model_or_runner):
    return model_or_runner.model if isinstance(model_or_runner, ModelRunner) else model_or_runner


def _output_vocab(model) -> int | None:
    """Token ids a model (or n-gram table) outputs: a reduced-vocabulary draft reports its full size."""
    config = getattr(_model(model), "config", None)
    return getattr(config, "full_vocab_size", None) or getattr(config, "vocab_size", None)


DRAFT = frozenset({"draft"})
REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add a method to the registry (by name: a second registration replaces the first)."""
    REGISTRY[method.name] = method
    return method


for _method in (
    Method("ar", lambda models, what: NoDraft(), policies.DraftingPolicy),
    Method("draft", _draft_model, policies.DraftingPolicy, DRAFT),
    Method("adaptive-hf", _draft_model, policies.HeuristicGamma, DRAFT),
    Method("adaptive-dual", _draft_model, policies.DualSignalGamma, DRAFT),
    Method("oracle", _draft_model, policies.Oracle, DRAFT, greedy_only=True),
    Method("entropy-stop", _draft_model, policies.EntropyStop, DRAFT),
    Method("confidence-stop", _draft_model, policies.ConfidenceStop, DRAFT),
    Method("adaedl", _draft_model, policies.AdaEDL, DRAFT),
    Method("learned-stop", _draft_model, policies.LearnedStop, DRAFT),
    Method("hierarchical", _hierarchy, hierarchy.HierarchyPolicy, frozenset({"draft", "draft_small"})),
    Method("hierarchical-noloop", _hierarchy, hierarchy.NoLoopPolicy, frozenset({"draft", "draft_small"})),
    Method("medusa", _medusa, tree_drafting.MedusaPolicy, frozenset({"heads"})),
    Method("draft-tree", _draft_tree, tree_drafting.DraftTreePolicy, DRAFT),
    Method("eagle-chain", _eagle_chain, eagle_heads.EagleChainPolicy, frozenset({"eagle"})),
    Method("eagle", _eagle_tree, eagle_heads.EaglePolicy, frozenset({"eagle"})),
    Method("block", _block, block.BlockPolicy, DRAFT),
    Method("block-confidence", _block, block.BlockConfidence, DRAFT),
):
    register(_method)

METHODS = tuple(REGISTRY)
ALIASES = {"greedy": "draft", "sampling": "draft"}  # the names before: one method with a temperature


def _registered(method: str) -> Method:
    """The registered method of a name or of one of its earlier names (`ALIASES`)."""
    return REGISTRY[ALIASES.get(method, method)]
GREEDY_ONLY = tuple(name for name, m in REGISTRY.items() if m.greedy_only)
HIERARCHICAL = ("hierarchical", "hierarchical-noloop")
TREES = ("medusa", "draft-tree", "eagle")
POLICIES = {name: m.policy for name, m in REGISTRY.items()}


def method_for_policy(policy: policies.DraftingPolicy) -> Method:
    """The registered method whose policy class is the closest ancestor of `policy`'s class (a plain
    `DraftingPolicy` subclass of your own runs with the draft model)."""
    mro = type(policy).__mro__
    candidates = [m for m in REGISTRY.values() if m.name != "ar" and isinstance(policy, m.policy)]
    return min(candidates, key=lambda m: mro.index(m.policy))


def policy_parameters(method: str) -> list[str]:
    """The parameters a method's policy takes through `params` (gamma comes separately)."""
    signature = inspect.signature(_registered(method).policy.__init__)
    return [name for name, p in signature.parameters.items()
            if name not in ("self", "gamma") and p.kind is not inspect.Parameter.VAR_KEYWORD]


def default_gamma(method: str):
    """The method's gamma when none is given (None: no cap)."""
    return inspect.signature(_registered(method).policy.__init__).parameters["gamma"].default


def make_policy(method: str, gamma, params: dict | None, draft=None) -> policies.DraftingPolicy:
    """The policy of `method`, with `params` checked against what it takes (gamma None: its default)."""
    params = dict(params or {})
    allowed = policy_parameters(method)
    unknown = sorted(set(params) - set(allowed))
    renamed = getattr(_registered(method).policy, "renamed", {})
    if unknown and unknown[0] in renamed:
        raise ValueError(f"the parameter {unknown[0]!r} of method {method!r} is now {renamed[unknown[0]]!r} (an "
                         f"entropy threshold, in nats; tau names tokens per target pass)")
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r} for method {method!r}; allowed: "
                         f"{', '.join(allowed) if allowed else 'none'}")
    if method == "learned-stop":
        params.setdefault("draft", _model(draft))
    if issubclass(_registered(method).policy, block.BlockPolicy) and isinstance(draft, block.BlockDrafter):
        # a block holds block_size - 1 drafts
        slots = draft.block_size - 1
        if gamma is not None and gamma > slots:
            raise ValueError(f"method {method!r}: gamma must be at most {slots} (this drafter's block_size - 1), "
                             f"got {gamma}")
        gamma = slots if gamma is None else gamma
    policy_class = _registered(method).policy
    return policy_class(**params) if gamma is None else policy_class(**params, gamma=gamma)


def make_verifier(policy) -> Verifier:
    """Exact verification, unless a tree policy asks for Medusa's (lossy) typical acceptance."""
    if getattr(policy, "acceptance", "exact") == "typical":
        return TypicalVerifier(*policy.typical)
    return Verifier()


def generate(target, input_ids, max_new_tokens: int, method="draft", draft=None, draft_small=None,
             heads=None, eagle=None, gamma: int | None = None, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, eos_token_id=None, generator=None, params: dict | None = None,
             executor=None) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `input_ids` [1, n] with `method`: a registered name
    (see the table in this module's docstring) or a `policies.DraftingPolicy` object of your own
    (fresh for each call: policies keep state; it runs with the proposer of the registered method
    whose policy class it extends, e.g. the draft model).

    temperature 0 is greedy: every method's output equals the target's own greedy output (in float32; in
    16-bit a verification pass over several tokens can round a near-tie the other way, notebook 01 shows one).
    Otherwise tokens are sampled from the target's distribution warped by temperature, top_k and top_p,
    exactly, for every method with its default verifier (rejection sampling; the tree methods'
    `acceptance="typical"`, Medusa's rule, is not exact). `gamma` is the most draft tokens along any one path
    of a round (a tree's depth), None for the method's default. `params` holds a policy's own
    parameters, e.g. `{"theta": 2.0}` for `entropy-stop`; `policy_parameters(method)` lists them.
    `hierarchical*` drafts with `draft_small` (M1: a draft model or an `ngram.NgramDraft`)
    pre-verified by `draft` (M2); `medusa` guesses a token tree with `heads` (`medusa.load_heads`),
    `draft-tree` grows one with `draft`; `eagle-chain` and `eagle` draft with an EAGLE head on the target's
    features (`eagle`: `core.eagle.load_eagle`, or `eagle_head_for(target)` for any small Llama; None
    loads the shipped head for the course's target). Models a method does not use are ignored (so one call can
    try every method). `target`, `draft` and `draft_small` may be models or `runner.ModelRunner`s (a
    runner owns its model's cache and, on a GPU, its CUDA graphs; reuse it across calls). Stops
    after `max_new_tokens` tokens or after `eos_token_id` (an id or a collection of ids). Returns a
    `GenerationResult` whose `rounds` hold per-round statistics.

    `executor`: None runs the rounds on the engine (`engine.decode`, the host loop); a
    `device_loop.DeviceExecutor()` runs the same method's rounds on the device, recorded as one CUDA graph each
    on a GPU, with the same acceptance and sampling functions (methods of one fixed round shape only).
    """
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"params must be a dict of the policy's parameters, e.g. {{'theta': 2.0}}, got {params!r}")
    if isinstance(method, policies.DraftingPolicy):  # your own policy object
        if params:
            raise ValueError(f"params are for a method name; a policy object ({method.name!r}) takes its parameters "
                             f"in its constructor")
        policy, spec, name, what = method, method_for_policy(method), method.name, f"policy {method.name!r}"
    elif isinstance(method, str) and (method in REGISTRY or method in ALIASES):
        spec, name, what = _registered(method), method, f"method {method!r}"
        if method == "ar" and params:
            raise ValueError(f"method 'ar' takes no params, got {sorted(params)}")
        policy = None
    else:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}, or a DraftingPolicy object")
    check_arguments(input_ids, max_new_tokens, temperature, top_k, top_p, gamma)
    if (spec.greedy_only or name in GREEDY_ONLY) and temperature != 0:
        raise ValueError(f"{what} is greedy only (it reads the target's greedy output); "
                         f"got temperature {temperature!r}, allowed: 0")
    models = {"target": target, "draft": draft, "draft_small": draft_small, "heads": heads, "eagle": eagle}
    if executor is not None:
        if not callable(getattr(executor, "run", None)):
            raise ValueError(f"executor must be None (the engine) or a device_loop.DeviceExecutor(), got {executor!r}")
        if policy is None:
            policy = policies.DraftingPolicy(0) if name == "ar" else make_policy(name, gamma, params, draft)
        head = _eagle_head(models, what) if spec.name in ("eagle", "eagle-chain") else None
        return executor.run(spec.name, name, target, draft, head, policy, input_ids, max_new_tokens,
                            Sampler(temperature, top_k, top_p), as_id_set(eos_token_id), generator)
    proposer = spec.make_proposer(models, what)
    if policy is None:
        policy = policies.DraftingPolicy(0) if name == "ar" else make_policy(name, gamma, params, draft)
    return decode(target, proposer, policy, input_ids, max_new_tokens, Sampler(temperature, top_k, top_p),
                  as_id_set(eos_token_id), generator, name, make_verifier(policy))
