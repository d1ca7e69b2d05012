"""DeepSeek-V3-family transformer: MLA (naive or absorbed), dense MLP then MoE with the noaux_tc gate, MTP.

Module and parameter names follow the HF checkpoint (``model.layers.3.self_attn.kv_b_proj.weight``), so the
loader copies tensors by name and a reader can hold both side by side. The one exception is the routed
experts: they are stacked per layer (``mlp.experts.gate_proj[E, I, H]``) so a grouped-GEMM kernel can
consume them directly; the loader stacks ``mlp.experts.<e>.gate_proj.weight`` into them.

Hot ops (norm, rope, SiLU·mul, routing, experts, fp8 GEMM, latent decode) go through :class:`OpSet`, so
each can run on torch (the oracle) or Triton. Tensor parallelism follows ``engine.sharding``: a model built
with ``tp=TP(rank, world, ...)`` holds its rank's shard and calls ``tp.all_reduce`` after row-parallel
layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.absorb import absorb_o, absorb_q, split_kv_b
from engine.config import ModelConfig
from engine.kv_cache import LayerCache, ModelCache, dense_cache
from engine.ops import OpSet
from engine.sharding import local_size

MLA_MODES = ("naive", "absorbed")


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass
class TP:
    """This process's place in a tensor-parallel group and the collectives the model needs."""

    rank: int = 0
    world: int = 1
    all_reduce: Callable[[torch.Tensor], torch.Tensor] = _identity  # sum over ranks
    all_gather: Callable[[torch.Tensor], torch.Tensor] = _identity  # concat over ranks on the last dim


def _param(*shape: int, dtype: torch.dtype | None = None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class Linear(nn.Module):
    """``y = x W^T``. An fp8 ``weight`` carries ``weight_scale_inv`` (one fp32 per 128×128 block) and runs
    as a w8a8 block GEMM; anything else runs as a plain matmul in the activation dtype."""

    def __init__(self, in_features: int, out_features: int, ops: OpSet, dtype: torch.dtype | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = _param(out_features, in_features, dtype=dtype)
        self.weight_scale_inv: torch.Tensor | None = None
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype == torch.float8_e4m3fn:
            lead = x.shape[:-1]
            xq, xs = self.ops.act_quant(x.reshape(-1, x.shape[-1]))
            y = self.ops.fp8_gemm(xq, xs, self.weight, self.weight_scale_inv)
            return y.to(x.dtype).view(*lead, self.out_features)
        return self.ops.linear(x, self.weight)

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight as a plain tensor (dequantised if fp8), for absorption."""
        if self.weight.dtype == torch.float8_e4m3fn:
            from kernels.fp8_quant import weight_dequant_ref

            return weight_dequant_ref(self.weight, self.weight_scale_inv, out_dtype=dtype)
        return self.weight.to(dtype)


def fuse_rows(first: Linear, second: Linear) -> torch.Tensor | None:
    """Put two projections of the same input into one ``[n1 + n2, K]`` weight (done once at load): their
    ``weight`` parameters become views of it, so one GEMM serves both and the state dict is unchanged.
    Returns the fused weight, or None where the weights cannot share one (fp8 blocks, different dtypes)."""
    a, b = first.weight, second.weight
    if (a.dtype == torch.float8_e4m3fn or b.dtype == torch.float8_e4m3fn or a.dtype != b.dtype
            or a.device != b.device or a.device.type == "meta" or a.shape[1] != b.shape[1]):
        return None
    w = torch.cat([a.detach(), b.detach()])
    first.weight = nn.Parameter(w[: a.shape[0]], requires_grad=False)
    second.weight = nn.Parameter(w[a.shape[0]:], requires_grad=False)
    return w


def fused_live(w: torch.Tensor | None, first: Linear) -> bool:
    """Whether ``w`` (from :func:`fuse_rows`) still holds ``first``'s weight (not replaced or moved since)."""
    return w is not None and first.weight.data_ptr() == w.data_ptr() and first.weight.device == w.device


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, ops: OpSet):
        super().__init__()
        self.weight = _param(dim)
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``; with ``residual``, ``(norm(h), h)`` for ``h = x + residual`` (one fused op)."""
        if residual is None:
            return self.ops.rmsnorm(x, self.weight, self.eps)
        return self.ops.rmsnorm(x, self.weight, self.eps, residual)


def softmax_scale(cfg: ModelConfig) -> float:
    """``qk_head_dim^-0.5``, times YaRN's ``mscale(factor, mscale_all_dim)^2`` when the context is extended."""
    scale = cfg.qk_head_dim ** -0.5
    if cfg.yarn is not None and cfg.yarn.mscale_all_dim:
        from kernels.rope import yarn_mscale

        m = yarn_mscale(cfg.yarn.factor, cfg.yarn.mscale_all_dim)
        scale *= m * m
    return scale


def rope_tables(cfg: ModelConfig, max_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(cos, sin)`` of shape ``[max_pos, rope_dim/2]``. With YaRN, the cos/sin magnitude carries
    ``mscale(factor, mscale)/mscale(factor, mscale_all_dim)`` as HF does (1 for DeepSeek-V3's own config)."""
    from kernels.rope import yarn_freqs, yarn_mscale

    y = cfg.yarn
    if y is None:
        return yarn_freqs(cfg.qk_rope_head_dim, max_pos, cfg.rope_theta)
    cos, sin = yarn_freqs(cfg.qk_rope_head_dim, max_pos, cfg.rope_theta, y.factor,
                          y.original_max_position_embeddings, y.beta_fast, y.beta_slow)
    if y.mscale and y.mscale_all_dim:
        mag = yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim)
    else:
        mag = yarn_mscale(y.factor)
    return cos * mag, sin * mag


class MLA(nn.Module):
    """Multi-head latent attention.

    ``naive`` expands the latent through ``kv_b_proj`` into per-head K and V and caches those;
    ``absorbed`` caches the normalised latent ``[kv_lora_rank]`` and the rope key ``[qk_rope_head_dim]``
    and folds ``kv_b_proj`` into q and o (see ``engine.absorb``).
    """

    def __init__(self, cfg: ModelConfig, ops: OpSet, tp: TP, dtype: torch.dtype | None):
        super().__init__()
        self.cfg, self.ops, self.tp = cfg, ops, tp
        self.n_heads = local_size(cfg.num_attention_heads, tp.world, "num_attention_heads")
        h, nh = cfg.hidden_size, self.n_heads
        if cfg.q_lora_rank is None:
            self.q_proj = Linear(h, nh * cfg.qk_head_dim, ops, dtype)
        else:
            self.q_a_proj = Linear(h, cfg.q_lora_rank, ops, dtype)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps, ops)
            self.q_b_proj = Linear(cfg.q_lora_rank, nh * cfg.qk_head_dim, ops, dtype)
        self.kv_a_proj_with_mqa = Linear(h, cfg.kv_lora_rank + cfg.qk_rope_head_dim, ops, dtype)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps, ops)
        self.kv_b_proj = Linear(cfg.kv_lora_rank, nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), ops, dtype)
        self.o_proj = Linear(nh * cfg.v_head_dim, h, ops, dtype)
        self.softmax_scale = softmax_scale(cfg)
        self._absorbed: tuple[torch.Tensor, torch.Tensor] | None = None
        self.qkv_a: torch.Tensor | None = None  # [q rows | kv_a rows] weight, set by fuse_projections
        self.cache: LayerCache | None = None  # installed by DeepseekV3.use_cache

    def fuse_projections(self) -> None:
        """One GEMM for the two projections of ``x`` (q or q_a, and kv_a) where their weights allow."""
        first = self.q_proj if self.cfg.q_lora_rank is None else self.q_a_proj
        self.qkv_a = fuse_rows(first, self.kv_a_proj_with_mqa)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, kv_a)``: the query (through q_a, its norm and q_b with a q LoRA) and the kv_a projection."""
        c = self.cfg
        first = self.q_proj if c.q_lora_rank is None else self.q_a_proj
        if fused_live(self.qkv_a, first):
            q, kv = self.ops.linear(x, self.qkv_a).split([first.out_features, self.kv_a_proj_with_mqa.out_features],
                                                         dim=-1)
        else:
            q, kv = first(x), self.kv_a_proj_with_mqa(x)
        if c.q_lora_rank is not None:
            q = self.q_b_proj(self.q_a_layernorm(q))
        return q, kv

    def absorbed_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self._absorbed is None or self._absorbed[0].dtype != dtype:
            c = self.cfg
            self._absorbed = split_kv_b(self.kv_b_proj.dense_weight(dtype), self.n_heads,
                                        c.qk_nope_head_dim, c.v_head_dim)
        return self._absorbed

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                end: int | None = None) -> torch.Tensor:
        """``x[B, S, H]`` at positions ``pos[B, S]``; ``cos``/``sin`` already gathered at ``pos``; ``end`` is
        ``pos.max() + 1`` or ``None`` (see :mod:`engine.kv_cache`). The layer's cache stores this step's rows
        and attends; which rows it keeps (per-head K/V or the latent) decides naive or absorbed MLA."""
        c, nh, cache = self.cfg, self.n_heads, self.cache
        if cache is None:
            raise RuntimeError("attention has no KV cache: call setup_cache() (or use_cache()) first")
        b, s, _ = x.shape
        q, kv_a = self._project(x)
        q = q.view(b, s, nh, c.qk_head_dim)
        q_nope, q_pe = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        # rope sees B*S rows of heads, each with its own cos/sin row: positions may differ per sequence
        r = c.qk_rope_head_dim
        cs, sn = cos.reshape(b * s, r // 2), sin.reshape(b * s, r // 2)
        # the normalised latent and the rotated rope key, side by side (one op: RMSNorm | RoPE)
        norm = self.kv_a_layernorm
        kv, k_pe = self.ops.rmsnorm_rope(kv_a, norm.weight, norm.eps, cs, sn).split([c.kv_lora_rank, r], dim=-1)

        if not cache.latent:
            q_pe = self.ops.rope(q_pe.reshape(b * s, nh, r), cs, sn).view(b, s, nh, r)
            kv_full = self.kv_b_proj(kv).view(b, s, nh, c.qk_nope_head_dim + c.v_head_dim)
            k_nope, v = kv_full.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
            cache.write(pos, torch.cat([k_nope, k_pe.unsqueeze(2).expand(b, s, nh, r)], dim=-1), v)
            o = cache.attend(torch.cat([q_nope, q_pe], dim=-1), None, pos, end, self.softmax_scale)
        else:
            cache.write(pos, kv, k_pe)
            w_uk, w_uv = self.absorbed_weights(x.dtype)
            # the latent query and its rotated rope part are written side by side into one buffer: the
            # decode kernel reads [q_lat | q_pe] rows, and no concatenation is needed
            lat = c.kv_lora_rank
            q_abs = torch.empty(b, s, nh, lat + r, dtype=x.dtype, device=x.device)
            absorb_q(q_nope, w_uk, out=q_abs[..., :lat])
            self.ops.rope(q_pe.reshape(b * s, nh, r), cs, sn, out=q_abs[..., lat:].view(b * s, nh, r))
            o_lat = cache.attend(q_abs[..., :lat], q_abs[..., lat:], pos, end, self.softmax_scale)  # [B, S, heads, C]
            o = absorb_o(o_lat, w_uv)
        return self.tp.all_reduce(self.o_proj(o.reshape(b, s, nh * c.v_head_dim)))


class MLP(nn.Module):
    """SwiGLU MLP: the dense layers and the shared experts."""

    def __init__(self, hidden: int, inter: int, ops: OpSet, tp: TP, dtype: torch.dtype | None, reduce: bool = True):
        super().__init__()
        inter = local_size(inter, tp.world, "intermediate size")
        self.gate_proj = Linear(hidden, inter, ops, dtype)
        self.up_proj = Linear(hidden, inter, ops, dtype)
        self.down_proj = Linear(inter, hidden, ops, dtype)
        self.ops, self.tp, self.reduce = ops, tp, reduce
        self.gate_up: torch.Tensor | None = None  # [gate rows | up rows] weight, set by fuse_projections

    def fuse_projections(self) -> None:
        self.gate_up = fuse_rows(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_live(self.gate_up, self.gate_proj):
            gu = self.ops.linear(x, self.gate_up)
        else:
            gu = torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1)
        if self.down_proj.weight.dtype == torch.float8_e4m3fn:
            y = self.down_proj(self.ops.silu_mul(gu))
        else:  # SwiGLU and the down projection: one op (one kernel at decode sizes)
            y = self.ops.silu_mul_linear(gu, self.down_proj.weight)
        return self.tp.all_reduce(y) if self.reduce else y


class Gate(nn.Module):
    """noaux_tc router. Logits are computed in fp32 from an fp32 weight (HF keeps ``gate.weight`` and
    ``e_score_correction_bias`` in fp32 too), so a bf16 model routes exactly like an fp32 one would."""

    def __init__(self, cfg: ModelConfig, ops: OpSet):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        self.weight = _param(cfg.n_routed_experts, cfg.hidden_size, dtype=torch.float32)
        self.e_score_correction_bias = _param(cfg.n_routed_experts, dtype=torch.float32)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cfg
        logits = self.ops.linear(x, self.weight.float(), torch.float32)
        return self.ops.moe_route(logits, self.e_score_correction_bias, c.num_experts_per_tok, c.n_group,
                                  c.topk_group, c.norm_topk_prob, c.routed_scaling_factor)


class Experts(nn.Module):
    """The routed experts of one layer, stacked: ``gate_proj``/``up_proj`` ``[E, I, H]``, ``down_proj``
    ``[E, H, I]`` (HF's per-expert ``experts.<e>.*.weight`` rows, in expert order)."""

    def __init__(self, cfg: ModelConfig, tp: TP, dtype: torch.dtype | None):
        super().__init__()
        e, h = cfg.n_routed_experts, cfg.hidden_size
        i = local_size(cfg.moe_intermediate_size, tp.world, "moe_intermediate_size")
        self.gate_proj = _param(e, i, h, dtype=dtype)
        self.up_proj = _param(e, i, h, dtype=dtype)
        self.down_proj = _param(e, h, i, dtype=dtype)
        self.gate_proj_scale_inv = self.up_proj_scale_inv = self.down_proj_scale_inv = None


# Pairs per expert from which MoE runs w8a8 on fp8 experts: prefill-sized batches, where the expert GEMMs
# are compute-bound and fp8 dots run at twice the bf16 rate (decode stays w8a16: it is bound by weight bytes).
W8A8_PAIRS_PER_EXPERT = 64


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: OpSet, tp: TP, dtype: torch.dtype | None):
        super().__init__()
        self.gate = Gate(cfg, ops)
        self.experts = Experts(cfg, tp, dtype)
        self.shared_experts = (MLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts, ops, tp,
                                   dtype, reduce=False) if cfg.n_shared_experts else None)
        self.ops, self.tp = ops, tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, ids = self.gate(x)
        ex = self.experts
        a8 = (ex.gate_proj.dtype == torch.float8_e4m3fn
              and ids.numel() >= W8A8_PAIRS_PER_EXPERT * ex.gate_proj.shape[0]
              and x.shape[-1] % 128 == 0 and ex.gate_proj.shape[1] % 128 == 0)
        shared = self.shared_experts(x) if self.shared_experts is not None else None
        y = self.ops.moe_experts(x, weights, ids, ex.gate_proj, ex.up_proj, ex.down_proj,
                                 ex.gate_proj_scale_inv, ex.up_proj_scale_inv, ex.down_proj_scale_inv, act_fp8=a8,
                                 add=shared)
        return self.tp.all_reduce(y).view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, ops: OpSet, tp: TP, dtype: torch.dtype | None):
        super().__init__()
        self.self_attn = MLA(cfg, ops, tp, dtype)
        self.mlp = MoE(cfg, ops, tp, dtype) if cfg.is_moe_layer(layer_id) else MLP(
            cfg.hidden_size, cfg.intermediate_size, ops, tp, dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)

    def forward(self, x, pos, cos, sin, end: int | None = None):
        y, h = self.step(x, None, pos, cos, sin, end)
        return h + y

    def step(self, x, residual, pos, cos, sin, end: int | None = None):
        """The block over the residual stream ``x + residual`` (``residual`` None: ``x`` alone), returned as
        ``(y, h)`` whose sum is the block's output. Each residual add is fused into the norm that follows it
        (the previous block's MLP add into this block's input norm), so the stream is never added alone."""
        if residual is None:
            h, n = x, self.input_layernorm(x)
        else:
            n, h = self.input_layernorm(x, residual)
        n, h = self.post_attention_layernorm(self.self_attn(n, pos, cos, sin, end), h)
        return self.mlp(n), h


class SharedHead(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: OpSet):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)


class MTPLayer(DecoderLayer):
    """Multi-token prediction: ``eh_proj(enorm(embed(t_{i+1})) ‖ hnorm(h_i))`` through one decoder block,
    then the model's own embedding and output head (the checkpoint's copies of those are not loaded)."""

    def __init__(self, cfg: ModelConfig, layer_id: int, ops: OpSet, tp: TP, dtype: torch.dtype | None):
        super().__init__(cfg, layer_id, ops, tp, dtype)
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.eh_proj = Linear(2 * cfg.hidden_size, cfg.hidden_size, ops, dtype)
        self.shared_head = SharedHead(cfg, ops)


class Embedding(nn.Module):
    """Vocab-parallel embedding: each rank holds a slice of rows and the partial lookups are summed."""

    def __init__(self, vocab: int, dim: int, tp: TP, dtype: torch.dtype | None):
        super().__init__()
        self.part = local_size(vocab, tp.world, "vocab_size")
        self.start = tp.rank * self.part
        self.weight = _param(self.part, dim, dtype=dtype)
        self.tp = tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.part)
        y = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(y)


class Body(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: OpSet, tp: TP, dtype: torch.dtype | None):
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, tp, dtype)
        layers: list[nn.Module] = [DecoderLayer(cfg, i, ops, tp, dtype) for i in range(cfg.num_hidden_layers)]
        layers += [MTPLayer(cfg, cfg.num_hidden_layers + j, ops, tp, dtype)
                   for j in range(cfg.num_nextn_predict_layers)]
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)


class DeepseekV3(nn.Module):
    """The whole model. ``model.layers[num_hidden_layers:]`` hold the optional MTP layer(s)."""

    def __init__(self, cfg: ModelConfig, *, dtype: torch.dtype | None = None, backend: str | dict = "torch",
                 tp: TP | None = None, max_positions: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.tp = tp or TP()
        self.ops = OpSet(backend)
        self.model = Body(cfg, self.ops, self.tp, dtype)
        self.lm_head = Linear(cfg.hidden_size, local_size(cfg.vocab_size, self.tp.world, "vocab_size"),
                              self.ops, dtype)
        self.max_positions = max_positions or cfg.max_position_embeddings
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.init_rope()
        self.mla_mode = "naive"
        self.kv_cache: ModelCache | None = None
        self._mm_fp32_out = True  # 16-bit head GEMM with fp32 output, where torch has it (see _logits)

    def init_rope(self, device=None) -> None:
        """(Re)compute the fp32 rope tables, e.g. after materialising a model built on the meta device."""
        device = torch.device(device) if device is not None else self.rope_cos.device
        cos, sin = rope_tables(self.cfg, self.max_positions)
        if cos.device.type == "meta" or device.type == "meta":
            self.rope_cos, self.rope_sin = cos.to("meta"), sin.to("meta")
        else:
            self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        return list(self.model.layers[: self.cfg.num_hidden_layers])

    @property
    def mtp_layers(self) -> list[MTPLayer]:
        return list(self.model.layers[self.cfg.num_hidden_layers:])

    def setup_cache(self, batch: int, max_len: int, mla: str = "naive", static: bool = False) -> None:
        """Allocate (and zero) a dense KV cache for every layer, MTP included: ``batch`` sequences of up to
        ``max_len`` tokens, per-head K/V (``mla="naive"``) or the absorbed latent (``"absorbed"``). ``static``
        attends over all ``max_len`` rows every step (no host sync; for ``torch.compile``)."""
        if mla not in MLA_MODES:
            raise ValueError(f"mla mode must be one of {MLA_MODES}, got {mla!r}")
        self.check_max_len(max_len)
        dtype = self.model.embed_tokens.weight.dtype
        heads = self.decoder_layers[0].self_attn.n_heads if self.cfg.num_hidden_layers else 0
        self.use_cache(dense_cache(self.cfg, heads, batch, max_len, mla, len(self.model.layers), self.ops, dtype,
                                   self.rope_cos.device, static))
        self.mla_mode = mla

    def use_cache(self, cache: ModelCache) -> None:
        """Install ``cache``: its layer ``i`` serves ``model.layers[i]``; layers past its end (the MTP layer,
        for a cache sized to the decoder) are left without one."""
        self.kv_cache = cache
        for i, layer in enumerate(self.model.layers):
            layer.self_attn.cache = cache.layers[i] if i < len(cache.layers) else None
        self.mla_mode = "absorbed" if cache.layers and cache.layers[0].latent else "naive"

    def check_max_len(self, max_len: int) -> None:
        if max_len > self.rope_cos.shape[0]:
            raise ValueError(f"max_len {max_len} exceeds the {self.rope_cos.shape[0]} rope positions of this model")

    def hidden(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Pre-final-norm hidden states ``[B, S, H]`` of ``tokens[B, S]`` at positions ``pos[B, S]``,
        reading and extending the KV cache. With the paged cache a one-token step syncs nothing with the
        host, so it can be captured as a CUDA graph."""
        x, h = self._stream(tokens, pos)
        return x if h is None else h + x

    def _stream(self, tokens: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last block's ``(y, h)`` (hidden states ``y + h``; ``h`` None without blocks)."""
        if self.kv_cache is None:
            raise RuntimeError("no KV cache: call setup_cache() (or use_cache()) first")
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]
        end = self.kv_cache.begin(pos)
        x = self.model.embed_tokens(tokens)
        h = None
        for layer in self.decoder_layers:
            x, h = layer.step(x, h, pos, cos, sin, end)
        return x, h

    def fuse_projections(self) -> None:
        """Concatenate the weights of projections that read the same input (q/q_a with kv_a; gate with up),
        so each pair is one GEMM. Called once the weights are loaded; the parameters become views."""
        for layer in self.model.layers:
            layer.self_attn.fuse_projections()
            for mlp in (layer.mlp, getattr(layer.mlp, "shared_experts", None)):
                if isinstance(mlp, MLP):
                    mlp.fuse_projections()

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """fp32 logits of pre-norm hidden states."""
        return self._logits(self.model.norm(h))

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """The vocabulary projection in fp32. A bf16 logit near 16 moves in 0.0625 steps, so a bf16 head turns
        close scores into exact ties and greedy decoding into a coin toss between equivalent kernels. On CUDA a
        16-bit head runs as a 16-bit GEMM with fp32 accumulation and fp32 output: the products of 16-bit values
        are exact in fp32, so the logits are the fp32 head's while the weight is read at half the bytes."""
        w16 = self.lm_head.weight
        if x.is_cuda and x.dtype == w16.dtype and w16.dtype in (torch.bfloat16, torch.float16) and self._mm_fp32_out:
            try:
                lead = x.shape[:-1]
                y = torch.mm(x.reshape(-1, x.shape[-1]), w16.t(), out_dtype=torch.float32)
                return self.tp.all_gather(y.view(*lead, y.shape[-1]))
            except (RuntimeError, TypeError):  # a torch without mm(out_dtype=): the fp32 copy below
                self._mm_fp32_out = False
        w = getattr(self, "_lm_head_fp32", None)
        if w is None or w.device != x.device:  # made once (before any CUDA-graph capture: decoders warm up first)
            w = self._lm_head_fp32 = self.lm_head.dense_weight(torch.float32)
        return self.tp.all_gather(F.linear(x.float(), w))

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, last: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, V]`` at index ``last[b]`` of each row (default: the last column)."""
        y, h = self._stream(tokens, pos)
        if last is None:
            y, h = y[:, -1], (h[:, -1] if h is not None else None)
        else:
            rows = torch.arange(y.shape[0], device=y.device)
            y, h = y[rows, last], (h[rows, last] if h is not None else None)
        # the final norm takes the last residual add with it
        return self._logits(self.model.norm(y) if h is None else self.model.norm(y, h)[0])

    def mtp_logits(self, h: torch.Tensor, next_tokens: torch.Tensor, pos: torch.Tensor, depth: int = 0) -> torch.Tensor:
        """Logits ``[B, S, V]`` for the token after ``next_tokens``, from the main model's pre-norm ``h`` at
        the same positions (``next_tokens[:, i]`` is the token that followed position ``i``)."""
        if depth >= len(self.mtp_layers):
            raise ValueError(f"this checkpoint has {len(self.mtp_layers)} MTP layer(s); depth {depth} requested")
        mtp = self.mtp_layers[depth]
        e = self.model.embed_tokens(next_tokens)
        x = mtp.eh_proj(torch.cat([mtp.enorm(e), mtp.hnorm(h)], dim=-1))
        x = DecoderLayer.forward(mtp, x, pos, self.rope_cos[pos], self.rope_sin[pos])
        return self._logits(mtp.shared_head.norm(x))


def dtype_of(name: str) -> torch.dtype:
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(table)}") from None
