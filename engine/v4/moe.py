"""V4's MoE block: hash-routed (a frozen ``tid2eid`` table picks the experts) or top-k routed
(``sqrtsoftplus`` scores plus a selection bias), the routed experts with a clamped SwiGLU, and one
shared expert with the same clamp. Routed experts are dense, or MXFP4 (packed e2m1 + UE8M0 per 32)
when the loader keeps them quantised.

The torch references of the expert ops loop over the experts a batch uses, which the host must read. A
decode-sized batch (at most :data:`STATIC_TOKENS` tokens) takes a static-shaped path instead that never
synchronises (so a decode step can be captured as a CUDA graph): few (token, expert) pairs gather their
experts' weights, more of them run every expert and keep the chosen ones. The Triton MXFP4 kernel is
static-shaped already and serves every batch size."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.v4.compressor import Step
from engine.v4.config import V4Config
from engine.v4.layers import Linear, linears_on, param
from engine.v4.ops import V4Ops

QAT_BLOCK = 128  # activation block of the w4a8 experts (act_quant's, and the kernel's default)
STATIC_TOKENS = 256  # decode batches: the sync-free expert path (prefill chunks take the op's reference)
_LUTS: dict[torch.device, torch.Tensor] = {}


def _swiglu(h: torch.Tensor, limit: float | None) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return F.silu(gate) * up


def _dequant(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """:func:`kernels.mxfp4.mxfp4_dequant_ref` to fp32, its e2m1 table kept on the device (no host copy in a
    captured step)."""
    from kernels.mxfp4 import E2M1, GROUP, ue8m0_to_f32

    lut = _LUTS.get(w.device)
    if lut is None:
        lut = _LUTS[w.device] = torch.tensor(E2M1, dtype=torch.float32, device=w.device)
    u8 = w.contiguous().view(torch.uint8)
    vals = torch.stack([lut[(u8 & 0xF).long()], lut[(u8 >> 4).long()]], dim=-1).flatten(-2)
    return vals * ue8m0_to_f32(scale).repeat_interleave(GROUP, dim=-1)


def _combine(y: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``Σ_k w[t, k] · y[t, k]`` in fp32 (the routing weight applied in ``y``'s dtype, as the references do)."""
    return (y * weights.to(y.dtype).unsqueeze(-1)).float().sum(dim=1).to(dtype)


def _act_qdq(x: torch.Tensor, block: int | None) -> torch.Tensor:
    if block is None:
        return x
    from kernels.fp8_quant import act_dequant_ref, act_quant_ref

    q, scale = act_quant_ref(x, block)
    return act_dequant_ref(q, scale, block=block)


def experts_static(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, limit: float | None, gate_up_scale: torch.Tensor | None = None,
                   down_scale: torch.Tensor | None = None, act_block: int | None = None) -> torch.Tensor:
    """:func:`kernels.mxfp4.swiglu_moe_ref` (or, with scales, ``mxfp4_moe_ref``; with ``act_block`` too,
    ``mxfp4_moe_w4a8_ref``: both GEMMs' activations block-quantised to e4m3 first) with static shapes and no
    host synchronisation. Dense experts compute in ``x.dtype``, MXFP4 ones dequantised to fp32, as the
    references."""
    t, h = x.shape
    e, k = gate_up.shape[0], ids.shape[1]
    mx = gate_up_scale is not None
    dt = torch.float32 if mx else x.dtype
    xd = _act_qdq(x.to(dt), act_block)
    # gathering copies each pair's weights (read, write, read again): cheaper than reading every expert once
    # only while 3·t·k < E
    if 3 * t * k < e:  # gather the chosen experts' weights, one (token, expert) pair per batch entry
        flat = ids.reshape(-1)
        wgu = _dequant(gate_up[flat], gate_up_scale[flat]) if gate_up_scale is not None else gate_up[flat].to(dt)
        wd = _dequant(down[flat], down_scale[flat]) if down_scale is not None else down[flat].to(dt)
        xs = xd.repeat_interleave(k, dim=0).unsqueeze(-1)  # [t*k, H, 1]
        hh = _act_qdq(_swiglu(torch.bmm(wgu, xs).squeeze(-1), limit), act_block)
        y = torch.bmm(wd, hh.unsqueeze(-1)).squeeze(-1).view(t, k, h)
    else:  # every expert on every token, then the chosen ones
        wgu = _dequant(gate_up, gate_up_scale) if gate_up_scale is not None else gate_up.to(dt)
        wd = _dequant(down, down_scale) if down_scale is not None else down.to(dt)
        hh = _act_qdq(_swiglu(F.linear(xd, wgu.reshape(-1, h)).view(t, e, -1), limit), act_block)  # [t, E, I]
        y_all = torch.bmm(hh.transpose(0, 1), wd.transpose(1, 2))  # [E, t, H]
        y = y_all.transpose(0, 1)[torch.arange(t, device=x.device).unsqueeze(1), ids]  # [t, k, H]
    return _combine(y, weights, x.dtype)


class Router(nn.Module):
    def __init__(self, cfg: V4Config, hashed: bool):
        super().__init__()
        self.weight = param(cfg.n_routed_experts, cfg.hidden_size)
        if hashed:
            self.tid2eid = nn.Buffer(torch.zeros(cfg.vocab_size, cfg.num_experts_per_tok, dtype=torch.long))
        else:
            self.e_score_correction_bias = nn.Buffer(torch.zeros(cfg.n_routed_experts, dtype=torch.float32))
        self.hashed = hashed

    def weight_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The router weight in ``dtype``, cast once (not per step) and again if the weight was replaced."""
        w = self.weight
        if w.dtype == dtype:
            return w
        c = self.__dict__.get("_cast")
        if c is None or c[0] != (w.data_ptr(), w.device, dtype):
            c = self.__dict__["_cast"] = ((w.data_ptr(), w.device, dtype), w.detach().to(dtype))
        return c[1]


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
        gate, up = linears_on(x, [self.gate_proj, self.up_proj])  # one GEMM
        return self.down_proj(F.silu(gate.clamp(max=self.limit)) * up.clamp(min=-self.limit, max=self.limit))


class MoE(nn.Module):
    def __init__(self, cfg: V4Config, mlp_type: str, ops: V4Ops, dtype: torch.dtype | None):
        super().__init__()
        self.gate = Router(cfg, mlp_type == "hash_moe")
        self.experts = Experts(cfg, dtype)
        self.shared_experts = SharedExpert(cfg, dtype)
        self.cfg, self.ops = cfg, ops
        self.qat = False  # MXFP4 experts as w4a8 (fp8 activations), like the fp8 linears' qat

    def _w4a8_triton(self, x: torch.Tensor) -> bool:
        """The Triton w4a8 kernel runs where the backend asks for it and the part has fp8 MMA."""
        if self.ops.backend_of("moe_mxfp4_qat") != "triton":
            return False
        from kernels.arch import capability
        from kernels.mxfp4 import w4a8_select

        return w4a8_select(capability(x.device))[0] is not None

    def route(self, x: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights[T, k], experts[T, k])`` for flat ``x[T, H]`` and its token ids."""
        c, g = self.cfg, self.gate
        logits = F.linear(x, g.weight_as(x.dtype))
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
        static = flat.shape[0] <= STATIC_TOKENS
        if ex.mxfp4 and self.qat:
            if self._w4a8_triton(flat):
                y = self.ops.moe_mxfp4_qat(flat, weights, ids, ex.gate_up_proj, ex.gate_up_proj_scale_inv,
                                           ex.down_proj, ex.down_proj_scale_inv, limit)
            elif static:
                y = experts_static(flat, weights, ids, ex.gate_up_proj, ex.down_proj, limit,
                                   ex.gate_up_proj_scale_inv, ex.down_proj_scale_inv, act_block=QAT_BLOCK)
            else:
                y = self.ops.reference("moe_mxfp4_qat")(flat, weights, ids, ex.gate_up_proj,
                                                        ex.gate_up_proj_scale_inv, ex.down_proj,
                                                        ex.down_proj_scale_inv, limit)
        elif ex.mxfp4 and static and self.ops.backend_of("moe_mxfp4") != "triton":
            y = experts_static(flat, weights, ids, ex.gate_up_proj, ex.down_proj, limit, ex.gate_up_proj_scale_inv,
                               ex.down_proj_scale_inv)
        elif not ex.mxfp4 and static and self.ops.backend_of("moe_dense") != "triton":
            y = experts_static(flat, weights, ids, ex.gate_up_proj, ex.down_proj, limit)
        elif ex.mxfp4:
            y = self.ops.moe_mxfp4(flat, weights, ids, ex.gate_up_proj, ex.gate_up_proj_scale_inv, ex.down_proj,
                                   ex.down_proj_scale_inv, limit)
        else:
            y = self.ops.moe_dense(flat, weights, ids, ex.gate_up_proj, ex.down_proj, limit)
        return (y + self.shared_experts(flat)).view(shape)
