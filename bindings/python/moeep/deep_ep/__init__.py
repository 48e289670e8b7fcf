"""DeepEP's V1 `Buffer` surface (deepseek-ai/DeepEP 2.1.0) on libmoeep.

    from moeep.deep_ep import Buffer, Config, EventOverlap   # instead of deep_ep

Works on PyTorch tensors: CUDA tensors go through the library's CUDA backend
on the current stream, CPU tensors through its host backend. Which arguments
are used, ignored or refused, and why: bindings/python/README.md (the table
is `moeep.deep_ep.policy.TABLE`). Importing this module does not import
torch; the calls that need tensors do.
"""
from .buffer import Buffer, DispatchHandle, LowLatencyHandle
from .config import Config
from .event import EventHandle, EventOverlap
from .policy import Unsupported

__all__ = ["Buffer", "Config", "EventHandle", "EventOverlap", "DispatchHandle", "LowLatencyHandle",
           "Unsupported", "topk_idx_t"]


def __getattr__(name):
    # deep_ep.topk_idx_t: int64 (DeepEP's default build), resolved without importing torch early.
    if name == "topk_idx_t":
        import torch
        return torch.int64
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
