"""The one hidden-state hook of the package: read a model's hidden state during a forward.

Two places in a decoder hold "the hidden state", and the course's parts read both:

- `"norm"`: the input of the final normalisation layer, every position fed (pre-norm). Medusa's heads
  (notebook 06) read it at the position that produced the newest token, and apply their own copy of the
  norm (the residual stream before it is what the heads were trained on).
- `"head"`: the input of the output head (post-norm), for the positions whose logits were computed
  (`logits_to_keep` slices it). The hidden-state drafting policies and the learned stop (notebook 04)
  read the draft's here.

`capture_hidden(model, where)` is a context manager yielding a list whose element 0, after each
forward, is that tensor [B, n, H]. A CUDA-graph replay runs no Python hooks, so a forward that must
return a hidden state runs eagerly (`runner.ModelRunner.forward(..., hidden=...)` does that).
"""
from __future__ import annotations

from contextlib import contextmanager

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
    if where not in WHERE:
        raise ValueError(f"where must be one of {', '.join(WHERE)}, got {where!r}")
    captured: list = []

    def keep(module, args, output):
        captured[:] = [args[0]]

    module = final_norm(model) if where == "norm" else model.get_output_embeddings()
    handle = module.register_forward_hook(keep)
    try:
        yield captured
    finally:
        handle.remove()
