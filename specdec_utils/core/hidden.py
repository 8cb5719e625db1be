"""The one hidden-state hook of the package: read a model's hidden state during a forward.

Two places in a decoder hold "the hidden state", and the course's parts read both:

- `"norm"`: the input of the final normalisation layer, every position fed (pre-norm). Medusa's heads
  (notebook 06) read it at the position that produced the newest token, and apply their own copy of the
  norm (the residual stream before it is what the heads were trained on).
- `"head"`: the input of the output head (post-norm), for the positions whose logits were computed
  (`logits_to_keep` slices it). The hidden-state drafting policies and the learned stop (notebook 04)
  read the draft's here.
- a tuple of layer indices, e.g. `(2, 15, 27)`: the residual stream *entering* those decoder layers
  (pre-norm), every position fed, concatenated along the last axis [B, n, len * H]; index N (the number of
  layers) is the final norm's input. EAGLE-3's heads (notebook 07) read a low, a middle and a high layer.

`capture_hidden(model, where)` is a context manager yielding a list whose element 0, after each
forward, is that tensor [B, n, H]. A CUDA-graph replay runs no Python hooks, so a forward that must
return a hidden state runs eagerly (`runner.ModelRunner.forward(..., hidden=...)` does that).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

WHERE = ("norm", "head")


def final_norm(model) -> nn.Module:
    """The model's final normalisation layer (Llama-style `model.norm` or GPT-2-style `transformer.ln_f`)."""
    for path in ("model.norm", "transformer.ln_f"):
        module = model
        for part in path.split("."):
            module = getattr(module, part, None)
        if isinstance(module, nn.Module):
            return module
    raise ValueError(f"need a model with a final norm at model.norm (Llama-style) or transformer.ln_f "
                     f"(GPT-2-style); {type(model).__name__} has neither")


@contextmanager
def capture_hidden(model, where: str = "norm"):
    """While active, element 0 of the yielded list is the hidden state at `where` ("norm": the final
    norm's input, all positions; "head": the output head's input, the kept positions) of `model`'s
    latest forward, [B, n, H]."""
    if isinstance(where, (tuple, list)):
        with _capture_layers(model, tuple(where)) as captured:
            yield captured
        return
    if where not in WHERE:
        raise ValueError(f"where must be one of {', '.join(WHERE)} or a tuple of layer indices, got {where!r}")
    captured: list = []

    def keep(module, args, output):
        captured[:] = [args[0]]

    module = final_norm(model) if where == "norm" else model.get_output_embeddings()
    handle = module.register_forward_hook(keep)
    try:
        yield captured
    finally:
        handle.remove()


def decoder_layers(model) -> nn.ModuleList:
    """The decoder layers of a Llama-style model (`model.model.layers`)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"need a Llama-style model with decoder layers at model.layers; {type(model).__name__} "
                         f"has none")
    return layers


@contextmanager
def _capture_layers(model, layers: tuple[int, ...]):
    blocks, norm = decoder_layers(model), final_norm(model)
    if not layers or not all(isinstance(i, int) and 0 <= i <= len(blocks) for i in layers):
        raise ValueError(f"layer indices must be integers in 0..{len(blocks)} ({len(blocks)} = the final norm's "
                         f"input), got {layers!r}")
    captured: list = []
    pieces: dict[int, object] = {}

    def entering(index):
        def hook(module, args, kwargs):
            pieces[index] = args[0] if args else kwargs["hidden_states"]
        return hook

    def done(module, args, output):  # the final norm runs after every layer: assemble
        pieces[len(blocks)] = args[0]
        captured[:] = [torch.cat([pieces[i] for i in layers], -1)]

    handles = [blocks[i].register_forward_pre_hook(entering(i), with_kwargs=True)
               for i in sorted(set(layers)) if i < len(blocks)]
    handles.append(norm.register_forward_hook(done))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()
