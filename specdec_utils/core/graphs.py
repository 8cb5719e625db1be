"""CUDA graphs: one recorder (`record_cuda_graph`) and one cache of recorded graphs (`GraphCache`), used by every
part of the package that records steps (`runner.ModelRunner`, `plain_llama.PlainRunner`, `eagle.EagleProposer`);
the runners keep each recorded step's static inputs, graph and outputs together (`StaticStep`).

A graph fixes every address it touched: when the buffers it read or wrote are replaced (a KV cache that grew), its
graphs must all be dropped, and with them their memory pool: PyTorch frees a private pool once no graph holds it,
and a pool whose graphs are all freed takes no new capture. `GraphCache.invalidate()` drops both together; the next
recording starts a new pool.

The invariant every caller keeps: **clone a graph's outputs before the next replay**. The graphs of one cache share
one pool (their intermediate and output tensors may overlap in memory) and are replayed in any order, so any
replay, of the same graph or another, may overwrite what an earlier replay returned.
"""
from __future__ import annotations

import torch


def record_cuda_graph(step, pool=None, warmups: int = 1):
    """Record `step()` (no arguments; static inputs and outputs) as a CUDA graph: run it `warmups` times on a side
    stream first (kernel and allocator set-up stays out of the graph; the warm-ups write what the replay will
    write), then capture it into `pool`. Returns (the graph, the tensors `step` returned during the capture,
    which every replay overwrites)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = step()
    return graph, outputs


class GraphCache(dict):
    """Recorded graphs by key (a dict: `cache[key] = entry` stores whatever the caller keeps, e.g. a `StaticStep`),
    and one memory pool for all of them, made on the first `record`. `invalidate()` drops every entry and the pool
    together (the buffers they were recorded on are gone) and moves `epoch` on. `captures` counts recordings."""

    def __init__(self):
        super().__init__()
        self.pool = None      # the graphs' memory pool handle (None until the first recording after an invalidate)
        self.captures = 0     # graphs recorded so far
        self.epoch = 0        # invalidations so far

    def record(self, step, warmups: int = 1):
        """Record `step()` into this cache's pool (`record_cuda_graph`); returns (the graph, its outputs). The caller
        stores what it needs under its key; clone the outputs after each replay (see the module docstring)."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        recorded = record_cuda_graph(step, self.pool, warmups=warmups)
        self.captures += 1
        return recorded

    def invalidate(self) -> None:
        """Drop every graph and the pool they share (a pool whose graphs are all freed takes no new capture)."""
        self.clear()
        self.pool = None
        self.epoch += 1


class StaticStep:
    """A step a graph records: its static inputs (the keyword arguments, as attributes: the tensors every replay reads,
    filled in before it), then once recorded its graph and outputs (None until then)."""

    def __init__(self, **inputs):
        vars(self).update(inputs)
        self.graph = self.outputs = None
