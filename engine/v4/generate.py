"""Greedy decode with the V4 caches for a batch of prompts of different lengths.

Prompts are right-padded into one prefill whose padding is marked invalid (never cached); each row then
decodes from its own length. Every step records the top-1 − top-2 logit margin for goldens.

:class:`V4Decoder` runs the model's own forward (no second decode path): one eager prefill, then one call
per step with one token per row. The caches have a fixed capacity and a step never synchronises with the
host, so on CUDA (not under the interpreter) the step, argmax and margin included, is captured once as a
CUDA graph and replayed; tokens stay on the device until the last step. :func:`generate` keeps one decoder
per (batch, capacity, kv layout) on the model, so repeated calls replay the graph they captured.
"""

from __future__ import annotations

import warnings

import torch

from engine.generate import Generation, check_prompts
from engine.v4.cache import LayerCache
from engine.v4.model import DeepseekV4

GRAPH_MAX_BATCH = 256
GRAPH_LEN_BUCKET = 256  # graphed decoders round their capacity up to this, so nearby lengths share a graph
MAX_GRAPHS = 8  # captured decoders a model keeps


def use_cuda_graph(device: torch.device, batch: int) -> bool:
    from kernels.arch import interpreting

    return device.type == "cuda" and not interpreting() and 1 <= batch <= GRAPH_MAX_BATCH


class V4Decoder:
    """Greedy decode of ``model`` for ``batch`` rows of up to ``max_len`` tokens (prompt + new). ``graphs``:
    capture the decode step as a CUDA graph (default: on CUDA, per :func:`use_cuda_graph`)."""

    def __init__(self, model: DeepseekV4, batch: int, max_len: int, kv: str = "dense", graphs: bool | None = None):
        self.model, self.batch, self.max_len, self.kv = model, batch, max_len, kv
        dev = model.device
        model.setup_cache(batch, max_len, kv)
        self.caches: list[LayerCache] = model.caches
        self._tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self._pos = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self._margin = torch.zeros(batch, dtype=torch.float32, device=dev)
        self._graph: torch.cuda.CUDAGraph | None = None
        self.capture_error: str | None = None
        if graphs if graphs is not None else use_cuda_graph(dev, batch):
            self._capture()

    @property
    def graphed(self) -> bool:
        return self._graph is not None

    def _step(self) -> None:
        """One decode step on the static buffers: the token at ``_pos`` in, the next token (argmax, ties to
        the lowest id) and its top-2 margin out, ``_pos`` advanced."""
        logits = self.model(self._tok, self._pos)
        top2 = logits.topk(2, dim=-1).values
        self._margin.copy_(top2[:, 0] - top2[:, 1])
        self._tok.copy_(logits.argmax(dim=-1, keepdim=True))
        self._pos.add_(1)

    def _capture(self) -> None:
        dev = self.model.device
        self.model.caches = self.caches
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.inference_mode(), torch.cuda.stream(stream):  # compile and autotune outside the capture
            for _ in range(2):
                self._step()
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.inference_mode(), torch.cuda.graph(graph):
                self._step()
            self._graph = graph
        except RuntimeError as exc:  # an op that cannot be captured: decode eagerly, and say why
            self.capture_error = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"V4 decode step not captured as a CUDA graph, decoding eagerly: {self.capture_error}",
                          stacklevel=3)
            torch.cuda.synchronize(dev)
        self.reset()

    @torch.inference_mode()
    def reset(self) -> None:
        for c in self.caches:
            c.reset()

    @torch.inference_mode()
    def step(self) -> None:
        """One decode step (a graph replay when captured); its token and margin stay in the decoder."""
        if self._graph is not None:
            self._graph.replay()
        else:
            self.model.caches = self.caches
            self._step()

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 eos_token_id: int | None = None) -> list[Generation]:
        """Greedy continuations in :func:`engine.generate.greedy_loop`'s format (a row stops recording after
        ``eos_token_id``)."""
        m, dev = self.model, self.model.device
        check_prompts(m.cfg.vocab_size, prompts, max_new_tokens)
        b = len(prompts)
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        s = max(len(p) for p in prompts)
        if b != self.batch or s + max_new_tokens > self.max_len:
            raise ValueError(f"this decoder holds {self.batch} rows of {self.max_len} tokens; got {b} prompts "
                             f"needing {s + max_new_tokens}")
        m.caches = self.caches
        self.reset()
        tokens = torch.zeros(b, s, dtype=torch.long)
        for i, p in enumerate(prompts):
            tokens[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        tokens = tokens.to(dev)
        cols = torch.arange(s, device=dev).unsqueeze(0)
        logits = m(tokens, cols.expand(b, s), cols < lens.unsqueeze(1), last=lens - 1)
        top2 = logits.topk(2, dim=-1).values
        out_tok = torch.empty(max_new_tokens, b, dtype=torch.long, device=dev)
        out_margin = torch.empty(max_new_tokens, b, dtype=torch.float32, device=dev)
        out_tok[0] = logits.argmax(dim=-1)
        out_margin[0] = top2[:, 0] - top2[:, 1]
        self._tok.copy_(out_tok[0].unsqueeze(1))
        self._pos.copy_(lens.unsqueeze(1))
        for i in range(1, max_new_tokens):
            self.step()
            out_tok[i].copy_(self._tok[:, 0])
            out_margin[i].copy_(self._margin)
        toks, margins = out_tok.t().tolist(), out_margin.t().tolist()
        outs = []
        for p, t, mg in zip(prompts, toks, margins, strict=True):
            n = t.index(eos_token_id) + 1 if eos_token_id is not None and eos_token_id in t else len(t)
            outs.append(Generation(prompt=list(map(int, p)), tokens=t[:n], margins=mg[:n]))
        return outs


def decoder_for(model: DeepseekV4, batch: int, max_len: int, kv: str = "dense",
                graphs: bool | None = None) -> V4Decoder:
    """The model's decoder for this shape, made (and on CUDA captured) on first use. Graphed decoders round
    ``max_len`` up to :data:`GRAPH_LEN_BUCKET` (within the model's rope positions) and are kept for reuse."""
    want = graphs if graphs is not None else use_cuda_graph(model.device, batch)
    cap = max_len
    if want:
        cap = min(-(-max_len // GRAPH_LEN_BUCKET) * GRAPH_LEN_BUCKET, model.max_positions)
    pool: dict = model.__dict__.setdefault("_decoders", {})
    key = (batch, cap, kv, want)
    dec = pool.get(key)
    if dec is None:
        # eager decoders are cheap to make: keep one; graphed ones up to MAX_GRAPHS (the oldest goes first)
        same = [k for k in pool if k[3] == want]
        for k in same[: max(0, len(same) - (MAX_GRAPHS - 1 if want else 0))]:
            del pool[k]
        dec = pool[key] = V4Decoder(model, batch, cap, kv, graphs=want)
    return dec


@torch.inference_mode()
def generate(model: DeepseekV4, prompts: list[list[int]], max_new_tokens: int,
             eos_token_id: int | None = None, kv: str = "dense", graphs: bool | None = None) -> list[Generation]:
    """Greedy continuations (ties to the lowest token id); ``kv="fp8"``: decode over the 584-byte FP8 pool;
    ``graphs``: replay the decode step as a CUDA graph (default: on CUDA)."""
    check_prompts(model.cfg.vocab_size, prompts, max_new_tokens)
    s = max(len(p) for p in prompts)
    return decoder_for(model, len(prompts), s + max_new_tokens, kv, graphs).generate(prompts, max_new_tokens,
                                                                                      eos_token_id)


@torch.inference_mode()
def prefill_logits(model: DeepseekV4, tokens: torch.Tensor) -> torch.Tensor:
    """fp32 logits at every position of an unpadded batch ``tokens[B, S]`` (for parity checks)."""
    b, s = tokens.shape
    model.setup_cache(b, s)
    pos = torch.arange(s, device=tokens.device).unsqueeze(0).expand(b, s)
    return model.logits(model.hidden(tokens, pos))
