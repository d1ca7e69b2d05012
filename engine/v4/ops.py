"""Which implementation the V4 model calls for each of its own hot ops.

Like :mod:`engine.ops`: ``backend="torch"`` uses the torch reference beside each kernel in ``kernels/``
(``<op>_ref``, the oracle); ``backend="triton"`` uses the Triton entry point of the same module (the name
without ``_ref``). Ops with no Triton kernel yet keep their reference on the Triton backend and say so in
:meth:`V4Ops.resolved`, so a decode comparison knows which parts it actually exercised. A reference that
filters on the host is replaced by a sync-free stand-in with the same results (:data:`SYNC_FREE`), and the
MoE block picks a static-shaped expert path for decode batches (:mod:`engine.v4.moe`), so a decode step
never waits on the host on either backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

OPS: dict[str, tuple[str, str]] = {
    "hc_pre": ("kernels.hc", "hc_pre_ref"),
    "hc_post": ("kernels.hc", "hc_post_ref"),
    "hc_head": ("kernels.hc", "hc_head_ref"),
    "topk_route": ("kernels.hash_routing", "topk_route_ref"),
    "hash_route": ("kernels.hash_routing", "hash_route_ref"),
    "moe_dense": ("kernels.mxfp4", "swiglu_moe_ref"),
    "moe_mxfp4": ("kernels.mxfp4", "mxfp4_moe_ref"),
    "moe_mxfp4_qat": ("kernels.mxfp4", "mxfp4_moe_w4a8_ref"),  # w4a8: fp8 activations, as QAT trained them
    "indexer_topk": ("kernels.indexer", "indexer_topk_ref"),
    "attention": ("kernels.sparse_mla", "sink_attention_ref"),
    "sparse_decode": ("kernels.sparse_mla", "sparse_mla_decode_ref"),
    "kv_pack": ("kernels.kv584", "kv584_store_ref"),
    "rmsnorm": ("kernels.rmsnorm", "rmsnorm_ref"),
}
BACKENDS = ("torch", "triton")
# torch references that filter on the host, and the sync-free stand-ins the engine calls instead (same
# results on the inputs the engine gives them), so a decode step on the torch path can be graph-captured
SYNC_FREE: dict[str, tuple[str, str]] = {
    "kv_pack": ("engine.v4.ops", "kv584_store_rows"),
    "rmsnorm": ("engine.v4.layers", "rms_norm"),  # the reference's math as torch's one fused op (no host read)
}


def kv584_store_rows(kv: torch.Tensor, pool: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """:func:`kernels.kv584.kv584_store_ref` for rows that are all real (>= 0): no boolean filter, so no host
    read (the engine's pools send writes that must not land to a trash row instead of ``-1``)."""
    from kernels.kv584 import TOKEN_BYTES, pack_ref

    pool.view(-1, TOKEN_BYTES)[rows.long()] = pack_ref(kv)
    return pool


class V4Ops:
    """``backend`` is one name for every op, or ``{op: backend, "default": backend}``."""

    def __init__(self, backend: str | dict[str, str] = "torch"):
        choices = set(backend.values()) if isinstance(backend, dict) else {backend}
        if not choices <= set(BACKENDS):
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if isinstance(backend, dict) and set(backend) - set(OPS) - {"default"}:
            raise ValueError(f"unknown op(s) in backend map: {', '.join(sorted(set(backend) - set(OPS) - {'default'}))}")
        self.backend = backend
        self._fns: dict[str, Callable] = {}
        self._used: dict[str, str] = {}

    def use(self, backend: str | dict[str, str]) -> None:
        """Switch every op to ``backend`` in place (the modules share this object). Caches made before keep
        the pool store they were given: call :meth:`DeepseekV4.setup_cache` again after switching."""
        fresh = V4Ops(backend)
        self.backend, self._fns, self._used = fresh.backend, fresh._fns, fresh._used

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_") or op not in OPS:
            raise AttributeError(op)
        fn = self._fns.get(op)
        if fn is None:
            module_name, ref = OPS[op]
            module = importlib.import_module(module_name)
            fn = getattr(module, ref)
            self._used[op] = "torch"
            want = (self.backend.get(op, self.backend.get("default", "torch")) if isinstance(self.backend, dict)
                    else self.backend)
            if want == "triton" and hasattr(module, ref.removesuffix("_ref")):
                fn = getattr(module, ref.removesuffix("_ref"))
                self._used[op] = "triton"
            elif op in SYNC_FREE:
                mod, name = SYNC_FREE[op]
                fn = getattr(importlib.import_module(mod), name)
            self._fns[op] = fn
        return fn

    def reference(self, op: str) -> Callable:
        """The torch reference of ``op`` whatever the backend (for a part the Triton kernel cannot run on)."""
        module_name, ref = OPS[op]
        return getattr(importlib.import_module(module_name), ref)

    def backend_of(self, op: str) -> str:
        """The backend that actually runs ``op`` (a Triton request falls back to torch where no kernel exists)."""
        getattr(self, op)
        return self._used[op]

    def resolved(self) -> dict[str, str]:
        """op → the backend that actually runs it."""
        for op in OPS:
            getattr(self, op)
        return dict(self._used)
