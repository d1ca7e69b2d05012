"""The engine's Triton decode path: absorbed MLA over a paged latent cache, Triton kernels, CUDA graphs.

:class:`PagedDecoder` drives a loaded :class:`~engine.model.DeepseekV3` with its own weights and its
:class:`~engine.ops.OpSet` (so ``backend="triton"`` puts every hot op on Triton), but keeps the KV state in
a :class:`~engine.paged_cache.PagedLatentCache` instead of the model's dense per-layer caches:

- prefill runs causal attention over the prompt in the latent space and writes each token's latent row
  into its sequence's pages;
- each decode step writes one row per sequence and calls the paged MLA decode kernel, which reads pages
  through the block table (rows past ``seq_lens`` hold NaN and are never read);
- routed experts run on the grouped MoE kernel with fp8 weights and their block scales as stored (no
  per-step dequantisation).

On CUDA (not under the interpreter) the decode step for a batch of at most :data:`GRAPH_MAX_BATCH` is captured
once as a CUDA graph and replayed; on CPU it runs eagerly. Greedy decoding follows
:func:`engine.generate.generate` (ties to the lowest id, top-2 margins recorded), so goldens compare.
"""

from __future__ import annotations

import torch

from engine.absorb import absorb_o, absorb_q
from engine.generate import Generation, _check_prompts
from engine.model import MLA, DeepseekV3, MoE
from engine.paged_cache import PagedLatentCache

GRAPH_MAX_BATCH = 64
PAGE_SIZE = 64


def use_cuda_graph(device: torch.device, batch: int, interpreting: bool) -> bool:
    """Graphs only where kernels really launch on a GPU and the batch is a decode batch."""
    return device.type == "cuda" and not interpreting and 1 <= batch <= GRAPH_MAX_BATCH


class PagedDecoder:
    """Greedy decode of ``model`` with a paged latent cache; ``graphs=None`` picks per :func:`use_cuda_graph`."""

    def __init__(self, model: DeepseekV3, *, page_size: int = PAGE_SIZE, graphs: bool | None = None):
        if model.tp.world != 1:
            raise ValueError("the paged decoder runs a single-rank model (tp.world == 1)")
        self.model, self.cfg, self.ops = model, model.cfg, model.ops
        self.page_size = page_size
        self.graphs = graphs
        self.device = model.rope_cos.device
        self.dtype = model.model.embed_tokens.weight.dtype
        self.cache: PagedLatentCache | None = None
        self._graph = None
        self._batch = 0
        self._absorbed = [layer.self_attn.absorbed_weights(self.dtype) for layer in model.decoder_layers]

    # --- setup -------------------------------------------------------------------------------------------

    def setup(self, batch: int, max_len: int) -> None:
        """Pages for ``batch`` sequences of up to ``max_len`` tokens; captures the decode graph on CUDA."""
        if max_len > self.model.rope_cos.shape[0]:
            raise ValueError(f"max_len {max_len} exceeds the {self.model.rope_cos.shape[0]} rope positions")
        pages_per_seq = -(-max_len // self.page_size)
        c = self.cfg
        self.cache = PagedLatentCache(
            c.num_hidden_layers, c.kv_lora_rank, c.qk_rope_head_dim, batch * pages_per_seq, batch, pages_per_seq,
            page_size=self.page_size, dtype=self.dtype, device=self.device,
        )
        for b in range(batch):
            self.cache.reserve(b, max_len)
        self._batch = batch
        self._graph = None
        from kernels.arch import interpreting

        want = self.graphs if self.graphs is not None else use_cuda_graph(self.device, batch, interpreting())
        if want:
            self._capture(batch)

    def _capture(self, batch: int) -> None:
        self._tok = torch.zeros(batch, dtype=torch.long, device=self.device)
        self._pos = torch.zeros(batch, dtype=torch.long, device=self.device)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # compile and autotune outside the capture (writes position 0 only)
            for _ in range(2):
                self._decode_eager(self._tok, self._pos)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._logits = self._decode_eager(self._tok, self._pos)
        self._graph = graph

    @property
    def graphed(self) -> bool:
        return self._graph is not None

    # --- layers ------------------------------------------------------------------------------------------

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Interleaved rope on ``x[B, S, heads, R]`` at ``pos[B, S]`` through the op table."""
        m = self.model
        if self.ops.backend_of("rope") == "triton":
            from kernels.rope import rope

            return rope(x, m.rope_cos, m.rope_sin, positions=pos)
        return self.ops.rope(x, m.rope_cos[pos].unsqueeze(2), m.rope_sin[pos].unsqueeze(2))

    def _attention(self, li: int, attn: MLA, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        c, nh = self.cfg, attn.n_heads
        b, s, _ = x.shape
        q = attn.q_proj(x) if c.q_lora_rank is None else attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x)))
        q = q.view(b, s, nh, c.qk_head_dim)
        q_nope, q_pe = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        q_pe = self._rope(q_pe, pos)
        kv, k_pe = attn.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        kv = attn.kv_a_layernorm(kv)
        k_pe = self._rope(k_pe.unsqueeze(2), pos).squeeze(2)
        self.cache.write(li, pos, kv, k_pe)
        w_uk, w_uv = self._absorbed[li]
        q_lat = absorb_q(q_nope, w_uk)  # [B, S, heads, C]
        if s == 1:
            from kernels.mla_decode import paged_mla_decode, paged_mla_decode_ref

            fn = paged_mla_decode if self.ops.backend_of("mla_decode") == "triton" else paged_mla_decode_ref
            q_full = torch.cat([q_lat[:, 0], q_pe[:, 0].to(q_lat.dtype)], dim=-1)
            o_lat, _ = fn(q_full, self.cache.layer(li), self.cache.block_table[:b], self.cache.seq_lens[:b],
                          attn.softmax_scale, c.kv_lora_rank)
            o_lat = o_lat.unsqueeze(1)
        else:  # prompt: causal attention among its own tokens, in the latent space
            kv_c = kv.to(x.dtype)
            scores = (torch.einsum("bshc,btc->bsht", q_lat, kv_c)
                      + torch.einsum("bshr,btr->bsht", q_pe, k_pe.to(x.dtype))).float() * attn.softmax_scale
            causal = pos.unsqueeze(-1) >= pos.unsqueeze(1)  # [B, S, T]
            p = scores.masked_fill(~causal.unsqueeze(2), float("-inf")).softmax(dim=-1).to(x.dtype)
            o_lat = torch.einsum("bsht,btc->bshc", p, kv_c)
        o = absorb_o(o_lat, w_uv)
        return attn.o_proj(o.reshape(b, s, nh * c.v_head_dim))

    def _moe(self, moe: MoE, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, ids = moe.gate(x)
        ex = moe.experts
        if ex.gate_proj.dtype == torch.float8_e4m3fn:
            y = self.ops.moe_experts(x, weights, ids, ex.gate_proj, ex.up_proj, ex.down_proj,
                                     ex.gate_proj_scale_inv, ex.up_proj_scale_inv, ex.down_proj_scale_inv)
        else:
            y = self.ops.moe_experts(x, weights, ids, ex.gate_proj, ex.up_proj, ex.down_proj)
        if moe.shared_experts is not None:
            y = y + moe.shared_experts(x)
        return y.view(shape)

    def _forward(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Pre-norm hidden states ``[B, S, H]``, extending the paged cache at ``pos``."""
        x = self.model.model.embed_tokens(tokens)
        for li, layer in enumerate(self.model.decoder_layers):
            x = x + self._attention(li, layer.self_attn, layer.input_layernorm(x), pos)
            h = layer.post_attention_layernorm(x)
            x = x + (self._moe(layer.mlp, h) if isinstance(layer.mlp, MoE) else layer.mlp(h))
        return x

    def _decode_eager(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b = tokens.shape[0]
        self.cache.seq_lens[:b].copy_(pos + 1)
        h = self._forward(tokens.unsqueeze(1), pos.unsqueeze(1))
        return self.model.head(h[:, 0])

    # --- public ------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Right-padded prompts ``tokens[B, S]`` of lengths ``lens``; logits ``[B, V]`` at each last token."""
        b, s = tokens.shape
        pos = torch.arange(s, device=self.device).unsqueeze(0).expand(b, s)
        h = self._forward(tokens, pos)
        self.cache.seq_lens[:b].copy_(lens.to(torch.int32))
        return self.model.head(h[torch.arange(b, device=self.device), lens - 1])

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One decode step: ``tokens[B]`` at positions ``pos[B]``; fp32 logits ``[B, V]``."""
        if self._graph is not None and tokens.shape[0] == self._batch:
            self._tok.copy_(tokens)
            self._pos.copy_(pos)
            self._graph.replay()
            return self._logits
        return self._decode_eager(tokens, pos)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, *,
                 eos_token_id: int | None = None) -> list[Generation]:
        """Greedy continuations, in :func:`engine.generate.generate`'s format (a sequence stops recording
        at ``eos_token_id``; the batch stops when all have)."""
        _check_prompts(self.model, prompts)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        b = len(prompts)
        lens = torch.tensor([len(p) for p in prompts], device=self.device)
        s = int(lens.max())
        self.setup(b, s + max_new_tokens)
        tokens = torch.zeros(b, s, dtype=torch.long, device=self.device)
        for i, p in enumerate(prompts):
            tokens[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        logits = self.prefill(tokens, lens)
        outs = [Generation(prompt=list(map(int, p))) for p in prompts]
        done = [False] * b
        for step in range(max_new_tokens):
            top2 = logits.topk(2, dim=-1).values
            nxt = logits.argmax(dim=-1)
            for i, (t, m) in enumerate(zip(nxt.tolist(), (top2[:, 0] - top2[:, 1]).tolist())):
                if not done[i]:
                    outs[i].tokens.append(t)
                    outs[i].margins.append(m)
                    done[i] = t == eos_token_id
            if step + 1 == max_new_tokens or all(done):
                break
            logits = self.step(nxt, lens + step)
        return outs
