"""Prefill, then greedy decode with the KV cache, for a batch of prompts of different lengths.

Prompts are right-padded into one prefill. Each sequence's cache row is indexed by its own absolute
positions, so a short prompt's pad slots (which no valid query can see) are overwritten as it decodes.
Every step also records the top-1 − top-2 logit margin, which goldens use to tell a near-tie from a break.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.model import DeepseekV3


@dataclass
class Generation:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)  # top-1 minus top-2 logit at each generated step


def check_prompts(vocab_size: int, prompts: list[list[int]], max_new_tokens: int = 1) -> None:
    """Bad prompts fail before any cache is allocated, naming the prompt; both model families use it."""
    if not prompts:
        raise ValueError("no prompts given")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    v = vocab_size
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        bad = [t for t in p if not 0 <= int(t) < v]
        if bad:
            raise ValueError(f"prompt {i} has token id(s) {bad[:5]} outside the vocabulary [0, {v})")


@torch.inference_mode()
def generate(model: DeepseekV3, prompts: list[list[int]], max_new_tokens: int, *, mla: str = "naive",
             eos_token_id: int | None = None) -> list[Generation]:
    """Greedy continuations of ``prompts``; ties go to the lowest token id (``argmax``'s rule)."""
    check_prompts(model.cfg.vocab_size, prompts, max_new_tokens)
    device = model.rope_cos.device
    b = len(prompts)
    lens = torch.tensor([len(p) for p in prompts], device=device)
    s = int(lens.max())
    model.setup_cache(b, s + max_new_tokens, mla)
    tokens = torch.zeros(b, s, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    pos = torch.arange(s, device=device).unsqueeze(0).expand(b, s)
    logits = model(tokens, pos, last=lens - 1)
    return greedy_loop(logits, lambda nxt, step: model(nxt.unsqueeze(1), (lens + step).unsqueeze(1)), prompts,
                       max_new_tokens, eos_token_id)


def greedy_loop(logits: torch.Tensor, step: Callable[[torch.Tensor, int], torch.Tensor], prompts: list[list[int]],
                max_new_tokens: int, eos_token_id: int | None = None) -> list[Generation]:
    """The greedy loop every model family shares, so goldens of V3 and V4 mean the same thing.

    ``logits[B, V]`` come from the prefill; ``step(next_tokens[B], i)`` runs decode step ``i`` (position
    ``len(prompt) + i``) and returns the next logits. Ties go to the lowest id (``argmax``'s rule) and each
    step's top-2 margin is recorded, so a comparator can tell a near-tie from a break.
    """
    b = logits.shape[0]
    outs = [Generation(prompt=list(map(int, p))) for p in prompts]
    done = torch.zeros(b, dtype=torch.bool, device=logits.device)
    for i in range(max_new_tokens):
        top2 = logits.topk(2, dim=-1).values
        nxt = logits.argmax(dim=-1)
        margin = (top2[:, 0] - top2[:, 1]).tolist()
        for j, (t, m) in enumerate(zip(nxt.tolist(), margin, strict=True)):
            if not done[j]:
                outs[j].tokens.append(t)
                outs[j].margins.append(m)
        if eos_token_id is not None:
            done |= nxt == eos_token_id
            if bool(done.all()):
                break
        if i + 1 == max_new_tokens:
            break
        logits = step(nxt, i)
    return outs


@torch.inference_mode()
def prefill_logits(model: DeepseekV3, tokens: torch.Tensor, mla: str = "naive") -> torch.Tensor:
    """fp32 logits at every position of an unpadded batch ``tokens[B, S]`` (for parity checks)."""
    b, s = tokens.shape
    model.setup_cache(b, s, mla)
    pos = torch.arange(s, device=tokens.device).unsqueeze(0).expand(b, s)
    return model.head(model.hidden(tokens, pos))
