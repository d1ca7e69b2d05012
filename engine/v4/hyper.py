"""Manifold-constrained hyper-connections: the ``hc_mult`` residual streams around every block, and the
hyper head that collapses them before the final norm. The math lives in :mod:`kernels.hc`."""

from __future__ import annotations

import torch
from torch import nn

from engine.v4.config import V4Config
from engine.v4.layers import param
from engine.v4.ops import V4Ops


class HyperConnection(nn.Module):
    """``fn[(2+N)·N, N·D]``, ``base[(2+N)·N]``, ``scale[3]`` (pre, post, comb), all fp32."""

    def __init__(self, cfg: V4Config, ops: V4Ops):
        super().__init__()
        n = cfg.hc_mult
        self.fn = param((2 + n) * n, n * cfg.hidden_size, dtype=torch.float32)
        self.base = param((2 + n) * n, dtype=torch.float32)
        self.scale = param(3, dtype=torch.float32)
        self.cfg, self.ops = cfg, ops

    def pre(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(block input, post, comb)`` from the streams ``[B, S, N, D]``."""
        c = self.cfg
        return self.ops.hc_pre(streams, self.fn, self.base, self.scale, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps)

    def post(self, out: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        return self.ops.hc_post(out, streams, post, comb)


class HyperHead(nn.Module):
    def __init__(self, cfg: V4Config, ops: V4Ops):
        super().__init__()
        n = cfg.hc_mult
        self.hc_fn = param(n, n * cfg.hidden_size, dtype=torch.float32)
        self.hc_base = param(n, dtype=torch.float32)
        self.hc_scale = param(1, dtype=torch.float32)
        self.cfg, self.ops = cfg, ops

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        return self.ops.hc_head(streams, self.hc_fn, self.hc_base, self.hc_scale, self.cfg.hc_eps,
                                self.cfg.rms_norm_eps)
