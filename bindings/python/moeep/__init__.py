"""libmoeep from Python: expert-parallel dispatch and combine over the C ABI
(ctypes; no compiled extension).

    import moeep
    uid = moeep.UniqueId.create()                 # one rank; share bytes(uid)
    comm = moeep.Communicator(nranks, rank, uid, num_experts=64, hidden=1024,
                              max_tokens_per_rank=256, max_topk=4, backend="host")
    d = comm.dispatch(x, topk_idx, topk_weights=w)    # NumPy, PyTorch, CuPy, DLPack
    out = comm.combine(expert_out, d.handle).out
    d.handle.close(); comm.close()

moeep.deep_ep.Buffer is DeepEP's V1 Buffer surface on these calls (PyTorch).
"""
from .arrays import ArrayView, view
from .comm import (Combined, Communicator, Dispatched, Handle, Layout, LowLatencyDispatched, UniqueId,
                   ll_buffer_bytes, make_config, transports, version)
from .errors import MoeepError
from ._find import LibraryNotFound

__version__ = "0.1.0"

__all__ = ["ArrayView", "view", "Combined", "Communicator", "Dispatched", "Handle", "Layout",
           "LowLatencyDispatched", "UniqueId", "ll_buffer_bytes", "make_config", "transports", "version",
           "MoeepError", "LibraryNotFound"]
