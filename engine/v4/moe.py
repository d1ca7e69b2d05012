"""V4's MoE block: hash-routed (a frozen ``tid2eid`` table picks the experts) or top-k routed
(``sqrtsoftplus`` scores plus a selection bias), the routed experts with a clamped SwiGLU, and one
shared expert with the same clamp. Routed experts are dense, or MXFP4 (packed e2m1 + UE8M0 per 32)
when the loader keeps them quantised."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.v4.compressor import Step
from engine.v4.config import V4Config
from engine.v4.layers import Linear, param
from engine.v4.ops import V4Ops


class Router(nn.Module):
    def __init__(self, cfg: V4Config, hashed: bool):
        super().__init__()
        self.weight = param(cfg.n_routed_experts, cfg.hidden_size)
        if hashed:
            self.tid2eid = nn.Buffer(torch.zeros(cfg.vocab_size, cfg.num_experts_per_tok, dtype=torch.long))
        else:
            self.e_score_correction_bias = nn.Buffer(torch.zeros(cfg.n_routed_experts, dtype=torch.float32))
        self.hashed = hashed


class Experts(nn.Module):
    """Stacked like HF: ``gate_up_proj[E, 2I, H]`` (gate rows first), ``down_proj[E, H, I]``. MXFP4 keeps
    int8 ``[.., K/2]`` weights with ``*_scale_inv`` UE8M0 ``[.., K/32]``."""

    def __init__(self, cfg: V4Config, dtype: torch.dtype | None):
        super().__init__()
        e, h, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = param(e, 2 * i, h, dtype=dtype)
        self.down_proj = param(e, h, i, dtype=dtype)
        self.gate_up_proj_scale_inv: torch.Tensor | None = None
        self.down_proj_scale_inv: torch.Tensor | None = None

    @property
    def mxfp4(self) -> bool:
        return self.gate_up_proj.dtype == torch.int8


class SharedExpert(nn.Module):
    def __init__(self, cfg: V4Config, dtype: torch.dtype | None):
        super().__init__()
        h, i = cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_proj = Linear(h, i, dtype)
        self.up_proj = Linear(h, i, dtype)
        self.down_proj = Linear(i, h, dtype)
        self.limit = cfg.swiglu_limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x).clamp(max=self.limit)
        up = self.up_proj(x).clamp(min=-self.limit, max=self.limit)
        return self.down_proj(F.silu(gate) * up)


class MoE(nn.Module):
    def __init__(self, cfg: V4Config, mlp_type: str, ops: V4Ops, dtype: torch.dtype | None):
        super().__init__()
        self.gate = Router(cfg, mlp_type == "hash_moe")
        self.experts = Experts(cfg, dtype)
        self.shared_experts = SharedExpert(cfg, dtype)
        self.cfg, self.ops = cfg, ops

    def route(self, x: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights[T, k], experts[T, k])`` for flat ``x[T, H]`` and its token ids."""
        c, g = self.cfg, self.gate
        logits = F.linear(x, g.weight.to(x.dtype))
        if g.hashed:
            return self.ops.hash_route(logits, g.tid2eid, tokens, c.routed_scaling_factor, c.scoring_func)
        return self.ops.topk_route(logits, g.e_score_correction_bias, c.num_experts_per_tok,
                                   c.routed_scaling_factor, c.scoring_func)

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, ids = self.route(flat, step.tokens.reshape(-1))
        if step.routes is not None:
            step.routes.append(ids.view(*shape[:-1], -1).clone())
        ex, limit = self.experts, self.cfg.swiglu_limit
        if ex.mxfp4:
            y = self.ops.moe_mxfp4(flat, weights, ids, ex.gate_up_proj, ex.gate_up_proj_scale_inv, ex.down_proj,
                                   ex.down_proj_scale_inv, limit)
        else:
            y = self.ops.moe_dense(flat, weights, ids, ex.gate_up_proj, ex.down_proj, limit)
        return (y + self.shared_experts(flat)).view(shape)
