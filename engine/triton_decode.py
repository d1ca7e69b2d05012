"""The engine's fast decoder: the model's own forward over a paged latent cache, replayed as a CUDA graph.

:class:`PagedDecoder` adds no attention code of its own. It installs a
:class:`~engine.paged_cache.PagedLatentCache` in a loaded :class:`~engine.model.DeepseekV3` (through
:func:`engine.kv_cache.paged_cache`, so each layer's :class:`~engine.model.MLA` writes its latent rows
into pages and decodes with the op set's ``paged_mla_decode``), and runs ``model(tokens, pos)``:

- prefill is the model's forward over the prompt (rows are written to pages, then read back for causal
  attention);
- each decode step writes one row per sequence and reads pages through the block table (rows past
  ``seq_lens`` hold NaN and are never read); the step syncs nothing with the host.

Which kernel serves each op is the model's :class:`~engine.ops.OpSet`'s business (``backend="triton"``
puts every hot op on Triton, fp8 experts included, with their block scales as stored). On CUDA (not under
the interpreter) the decode step for a batch of at most :data:`GRAPH_MAX_BATCH` is captured once as a CUDA
graph and replayed, when every op is graph-safe (:attr:`~engine.ops.OpSet.graph_safe`); otherwise, and on
CPU, it runs eagerly. Greedy decoding follows :func:`engine.generate.generate` (ties
to the lowest id, top-2 margins recorded), so goldens compare.
"""

from __future__ import annotations

import torch

from engine.generate import Generation, check_prompts
from engine.kv_cache import paged_cache
from engine.model import DeepseekV3
from engine.paged_cache import PagedLatentCache

GRAPH_MAX_BATCH = 256  # one captured step per batch size; nothing in a step depends on the batch being small
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

    # --- setup -------------------------------------------------------------------------------------------

    def setup(self, batch: int, max_len: int) -> None:
        """Pages for ``batch`` sequences of up to ``max_len`` tokens; captures the decode graph on CUDA."""
        self.model.check_max_len(max_len)
        pages_per_seq = -(-max_len // self.page_size)
        c = self.cfg
        self.cache = PagedLatentCache(
            c.num_hidden_layers, c.kv_lora_rank, c.qk_rope_head_dim, batch * pages_per_seq, batch, pages_per_seq,
            page_size=self.page_size, dtype=self.dtype, device=self.device,
        )
        for b in range(batch):
            self.cache.reserve(b, max_len)
        self.model.use_cache(paged_cache(self.cache, self.ops))
        self._batch = batch
        self._graph = None
        from kernels.arch import interpreting

        want = self.graphs if self.graphs is not None else (
            use_cuda_graph(self.device, batch, interpreting()) and self.ops.graph_safe)
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

    def _decode_eager(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.model(tokens.unsqueeze(1), pos.unsqueeze(1))

    # --- public ------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Right-padded prompts ``tokens[B, S]`` of lengths ``lens``; logits ``[B, V]`` at each last token."""
        b, s = tokens.shape
        pos = torch.arange(s, device=self.device).unsqueeze(0).expand(b, s)
        logits = self.model(tokens, pos, last=lens - 1)
        self.cache.seq_lens[:b].copy_(lens.to(torch.int32))
        return logits

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
        check_prompts(self.cfg.vocab_size, prompts)
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
