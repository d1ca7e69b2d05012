"""Attention with a learnable sink over V4's shared key/value head, dense-masked (the engine's oracle) and
sparse over the 584-byte paged FP8 pool (decode).

The sink is one logit per head that joins the softmax's denominator and contributes no value, so a head
can attend to "nothing". Keys are also values (MQA with one 512-wide head).
"""

from __future__ import annotations

import torch


def sink_attention_ref(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, sinks: torch.Tensor,
                       scale: float) -> torch.Tensor:
    """``q[B, S, H, D]`` against ``kv[B, T, D]`` where ``mask[B, S, T]``; fp32 softmax with ``sinks[H]``;
    returns ``[B, S, H, D]`` in ``q.dtype``."""
    s = torch.einsum("bshd,btd->bsht", q.float(), kv.float()) * scale
    s = s.masked_fill(~mask.unsqueeze(2), float("-inf"))
    sink = sinks.float().view(1, 1, -1, 1).expand(*s.shape[:3], 1)
    logits = torch.cat([s, sink], dim=-1)
    p = (logits - logits.amax(dim=-1, keepdim=True)).softmax(dim=-1)[..., :-1]
    return torch.einsum("bsht,btd->bshd", p, kv.float()).to(q.dtype)
