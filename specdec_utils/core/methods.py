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

A method family is imported when its method is first used, not with this module: the registry holds each
family's policy as "module:Class" text and its proposer builder imports the family inside, so
`generate(..., method="draft")` imports no EAGLE, block drafter, Medusa, hierarchy or Triton kernels
(`tree_attention`).
"""
from __future__ import annotations

import importlib
import inspect
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping

from . import policies
from .engine import DraftModelProposer, GenerationResult, NoDraft, Sampler, as_id_set, check_arguments, decode
from .runner import ModelRunner
from .verify import TypicalVerifier, Verifier


class Method:
    """A named method: `make_proposer(models, what)` builds its proposer from the models passed to
    `generate` (a dict with "target", "draft", "draft_small", "heads", "eagle"); `policy` is its policy class
    (its parameters come from `params`), given as the class or as "module:Class" text ("module" absolute, or
    relative to `specdec_utils.core` with a leading dot: ".eagle:EaglePolicy"), imported the first time it is
    read; `uses` names the models it reads; `greedy_only` methods refuse a temperature."""
    __slots__ = ("name", "make_proposer", "_policy", "uses", "greedy_only")

    def __init__(self, name: str, make_proposer: Callable, policy: type | str, uses: frozenset = frozenset(),
                 greedy_only: bool = False):
        self.name, self.make_proposer, self._policy = name, make_proposer, policy
        self.uses, self.greedy_only = frozenset(uses), greedy_only

    @property
    def policy(self) -> type:
        """The policy class (its module imported now if it was given as text)."""
        if isinstance(self._policy, str):
            self._policy = _resolve(self._policy)
        return self._policy

    def loaded_policy(self) -> type | None:
        """The policy class if its module is imported already, else None (importing nothing)."""
        if isinstance(self._policy, str) and _module_path(self._policy) not in sys.modules:
            return None
        return self.policy

    def __repr__(self) -> str:
        policy = self._policy if isinstance(self._policy, str) else self._policy.__name__
        return f"Method({self.name!r}, policy={policy!r}, uses={sorted(self.uses)}, greedy_only={self.greedy_only})"


def _module_path(reference: str) -> str:
    module = reference.partition(":")[0]
    return f"{__package__}{module}" if module.startswith(".") else module


def _resolve(reference: str):
    """The object "module:name" names, its module imported (a leading dot: relative to this package)."""
    module, _, attr = reference.partition(":")
    if not attr:
        raise ValueError(f"a policy given as text is 'module:Class', got {reference!r}")
    return getattr(importlib.import_module(_module_path(reference)), attr)


def _family(name: str):
    """A module of `specdec_utils.core` if it is imported already, else None: an object of one of its classes
    cannot exist before it is (so an isinstance test against it can skip the import)."""
    return sys.modules.get(f"{__package__}.{name}")


def _draft_model(models, what):
    draft = models["draft"]
    if draft is None:
        raise ValueError(f"{what} needs a draft model: pass draft=...")
    return DraftModelProposer(draft)


def _hierarchy(models, what):
    HierarchicalProposer, NgramDraft = _resolve(".hierarchy:HierarchicalProposer"), _resolve(".ngram:NgramDraft")
    draft, small = models["draft"], models["draft_small"]
    if draft is None:
        raise ValueError(f"{what} needs a draft model: pass draft=...")
    if small is None:
        raise ValueError(f"{what} needs draft_small=... (M1, the fastest level: a draft model or an n-gram "
                         f"table) under draft=... (M2)")
    if not (isinstance(small, (NgramDraft, ModelRunner)) or callable(small)):
        raise ValueError(f"draft_small must be a model or an n-gram table (specdec_utils.core.ngram.NgramDraft), got "
                         f"{type(small).__name__} {small!r:.60}")
    small_vocab, middle_vocab = _output_vocab(small), _output_vocab(draft)
    if None not in (small_vocab, middle_vocab) and small_vocab != middle_vocab:
        raise ValueError(f"draft_small and draft must share the output vocabulary, got {small_vocab} and "
                         f"{middle_vocab} token ids")
    return HierarchicalProposer(small, draft)


def _medusa(models, what):
    MedusaHeads, MedusaProposer = _resolve(".medusa:MedusaHeads"), _resolve(".tree_drafting:MedusaProposer")
    heads, target = models["heads"], _model(models["target"])
    if not isinstance(heads, MedusaHeads):
        raise ValueError(f"{what} needs heads=... (Medusa heads: specdec_utils.core.medusa.load_heads('medusa-heads', "
                         f"target)), got {type(heads).__name__}")
    if heads.target is not target:
        raise ValueError(f"{what}: these heads are attached to another target object; load them for this one: "
                         f"load_heads(name, target)")
    return MedusaProposer(heads)


def _draft_tree(models, what):
    NgramDraft, DraftTreeProposer = _resolve(".ngram:NgramDraft"), _resolve(".tree_drafting:DraftTreeProposer")
    draft = models["draft"]
    usable = callable(draft) or isinstance(draft, ModelRunner)
    if draft is None or isinstance(draft, NgramDraft) or not usable:
        raise ValueError(f"{what} needs draft=... a transformers draft model (it runs tree-masked forwards), "
                         f"got {type(draft).__name__}")
    return DraftTreeProposer(draft)


# target -> the shipped head loaded for it; the head holds its target weakly, so the entry goes with the target
_SHIPPED_EAGLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _eagle_head(models, what):
    eagle_heads = importlib.import_module(_module_path(".eagle"))
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
    return _resolve(".eagle:EagleProposer")(_eagle_head(models, what), tree=False)


def _eagle_tree(models, what):
    return _resolve(".eagle:EagleProposer")(_eagle_head(models, what), tree=True)


def _block(models, what):
    BlockDrafter, BlockProposer = _resolve(".block:BlockDrafter"), _resolve(".block:BlockProposer")
    drafter = models["draft"]
    if not isinstance(drafter, BlockDrafter):
        raise ValueError(f"{what} needs draft=... a block drafter (specdec_utils.core.block.block_drafter_for(target) "
                         f"or a trained one), got {type(drafter).__name__}")
    return BlockProposer(drafter)


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
    Method("hierarchical", _hierarchy, ".hierarchy:HierarchyPolicy", frozenset({"draft", "draft_small"})),
    Method("hierarchical-noloop", _hierarchy, ".hierarchy:NoLoopPolicy", frozenset({"draft", "draft_small"})),
    Method("medusa", _medusa, ".tree_drafting:MedusaPolicy", frozenset({"heads"})),
    Method("draft-tree", _draft_tree, ".tree_drafting:DraftTreePolicy", DRAFT),
    Method("eagle-chain", _eagle_chain, ".eagle:EagleChainPolicy", frozenset({"eagle"})),
    Method("eagle", _eagle_tree, ".eagle:EaglePolicy", frozenset({"eagle"})),
    Method("block", _block, ".block:BlockPolicy", DRAFT),
    Method("block-confidence", _block, ".block:BlockConfidence", DRAFT),
):
    register(_method)

METHODS = tuple(REGISTRY)
ALIASES = {"greedy": "draft", "sampling": "draft"}  # the names before: one method with a temperature


GREEDY_ONLY = tuple(name for name, m in REGISTRY.items() if m.greedy_only)
HIERARCHICAL = ("hierarchical", "hierarchical-noloop")
TREES = ("medusa", "draft-tree", "eagle")


def _registered(method: str) -> Method:
    """The registered method of a name or of one of its earlier names (`ALIASES`)."""
    return REGISTRY[ALIASES.get(method, method)]


class _Policies(Mapping):
    """method name -> its policy class, read from the registry (a family is imported when its entry is read)."""

    def __getitem__(self, name: str) -> type:
        return REGISTRY[name].policy

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY)

    def __len__(self) -> int:
        return len(REGISTRY)


POLICIES: Mapping[str, type] = _Policies()


def method_for_policy(policy: policies.DraftingPolicy) -> Method:
    """The registered method whose policy class is the closest ancestor of `policy`'s class (a plain
    `DraftingPolicy` subclass of your own runs with the draft model). A family not imported yet holds no
    ancestor of an existing object's class, so it stays unimported."""
    mro = type(policy).__mro__
    candidates = [(m, cls) for m in REGISTRY.values() if m.name != "ar"
                  for cls in [m.loaded_policy()] if cls is not None and isinstance(policy, cls)]
    return min(candidates, key=lambda pair: mro.index(pair[1]))[0]


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
    policy_class = _registered(method).policy  # its family imported now
    allowed = policy_parameters(method)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r} for method {method!r}; allowed: "
                         f"{', '.join(allowed) if allowed else 'none'}")
    if method == "learned-stop":
        params.setdefault("draft", _model(draft))
    block = _family("block")  # None: neither this policy nor the draft can be the block drafter's
    if block is not None and issubclass(policy_class, block.BlockPolicy) and isinstance(draft, block.BlockDrafter):
        # a block holds block_size - 1 drafts
        slots = draft.block_size - 1
        if gamma is not None and gamma > slots:
            raise ValueError(f"method {method!r}: gamma must be at most {slots} (this drafter's block_size - 1), "
                             f"got {gamma}")
        gamma = slots if gamma is None else gamma
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
