"""Greedy decode with the V4 caches for a batch of prompts of different lengths.

Prompts are right-padded into one prefill whose padding is marked invalid (never cached); each row then
decodes from its own length. Every step records the top-1 − top-2 logit margin for goldens.
"""

from __future__ import annotations

import torch

from engine.generate import Generation, check_prompts, greedy_loop
from engine.v4.model import DeepseekV4


@torch.inference_mode()
def generate(model: DeepseekV4, prompts: list[list[int]], max_new_tokens: int,
             eos_token_id: int | None = None, kv: str = "dense") -> list[Generation]:
    """Greedy continuations (ties to the lowest token id); ``kv="fp8"``: decode over the 584-byte FP8 pool."""
    check_prompts(model.cfg.vocab_size, prompts, max_new_tokens)
    dev = model.device
    b = len(prompts)
    lens = torch.tensor([len(p) for p in prompts], device=dev)
    s = int(lens.max())
    model.setup_cache(b, s + max_new_tokens, kv)
    tokens = torch.zeros(b, s, dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    cols = torch.arange(s, device=dev).unsqueeze(0)
    logits = model(tokens, cols.expand(b, s), cols < lens.unsqueeze(1), last=lens - 1)
    return greedy_loop(logits, lambda nxt, step: model(nxt.unsqueeze(1), (lens + step).unsqueeze(1)), prompts,
                       max_new_tokens, eos_token_id)


@torch.inference_mode()
def prefill_logits(model: DeepseekV4, tokens: torch.Tensor) -> torch.Tensor:
    """fp32 logits at every position of an unpadded batch ``tokens[B, S]`` (for parity checks)."""
    b, s = tokens.shape
    model.setup_cache(b, s)
    pos = torch.arange(s, device=tokens.device).unsqueeze(0).expand(b, s)
    return model.logits(model.hidden(tokens, pos))
