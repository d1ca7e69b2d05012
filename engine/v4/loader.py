"""Load a DeepSeek-V4 HF checkpoint (safetensors shards + index) into :class:`engine.v4.model.DeepseekV4`.

Names are HF's ``DeepseekV4ForCausalLM`` names. FP8 e4m3 projections carry ``<name>_scale_inv`` (fp32, or
UE8M0 bytes with ``scale_fmt: ue8m0``) per 128×128 block; MXFP4 experts are int8 ``[.., K/2]`` (two e2m1
per byte, low nibble first) with ``<name>_scale_inv`` UE8M0 ``[.., K/32]``. ``fp8``/``mxfp4="dequant"``
expands them on load; ``"keep"`` keeps them for the quantised paths (w8a8 linears, w4a16 experts). Every
tensor is checked against the shape the config implies; a missing, misshapen or unexpected tensor raises
:class:`CheckpointError` naming it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from engine.loader import CheckpointError, _DictReader, _Reader, checkpoint_index
from engine.v4.config import V4Config, load_v4_config
from engine.v4.layers import FP8, Linear
from engine.v4.model import DeepseekV4
from engine.v4.moe import Experts

Progress = Callable[[int, int, str], None]
_EXPERT_PARTS = ("gate_up_proj", "down_proj")


def _scales_f32(s: torch.Tensor) -> torch.Tensor:
    if s.dtype in (torch.uint8, torch.float8_e8m0fnu):
        from kernels.mxfp4 import ue8m0_to_f32

        return ue8m0_to_f32(s)
    return s.float()


def _fp8_weight(r: _Reader, name: str, t: torch.Tensor, shape: tuple[int, ...], cfg: V4Config,
                dtype: torch.dtype, keep: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    sname = name + "_scale_inv"
    if not r.has(sname):
        raise CheckpointError(f"fp8 tensor {name!r} has no {sname!r} block scales")
    block = cfg.fp8_block or (128, 128)
    s = r.get(sname)
    lead = shape[:-2]
    want = (*lead, math.ceil(shape[-2] / block[0]), math.ceil(shape[-1] / block[1]))
    if tuple(s.shape) != want:
        raise CheckpointError(f"tensor {sname!r} has shape {list(s.shape)}, expected {list(want)} "
                              f"({block[0]}x{block[1]} blocks of {list(shape)})")
    sf = _scales_f32(s)
    if keep and not lead:
        return t, sf
    from kernels.fp8_quant import weight_dequant_ref

    if block[0] != block[1]:
        raise CheckpointError(f"weight_block_size {list(block)} is not square; only square blocks are supported")
    flat_w, flat_s = t.reshape(-1, *shape[-2:]), sf.reshape(-1, *want[-2:])
    out = torch.stack([weight_dequant_ref(w, si, block=block[0], out_dtype=dtype) for w, si in zip(flat_w, flat_s)])
    return out.view(shape), None


def _mxfp4_weight(r: _Reader, name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
                  keep: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    sname = name + "_scale_inv"
    packed = (*shape[:-1], shape[-1] // 2)
    if tuple(t.shape) != packed:
        raise CheckpointError(f"MXFP4 tensor {name!r} has shape {list(t.shape)}, expected {list(packed)} "
                              f"(two e2m1 values per byte of {list(shape)})")
    if not r.has(sname):
        raise CheckpointError(f"MXFP4 tensor {name!r} has no {sname!r} UE8M0 scales")
    s = r.get(sname)
    want = (*shape[:-1], shape[-1] // 32)
    if tuple(s.shape) != want:
        raise CheckpointError(f"tensor {sname!r} has shape {list(s.shape)}, expected {list(want)} (one per 32)")
    if s.dtype not in (torch.uint8, torch.float8_e8m0fnu):
        raise CheckpointError(f"tensor {sname!r} is {s.dtype}; MXFP4 scales are UE8M0 (float8_e8m0fnu or uint8)")
    s = s.view(torch.float8_e8m0fnu)
    if keep:
        return t.view(torch.int8), s
    from kernels.mxfp4 import mxfp4_dequant_ref

    return mxfp4_dequant_ref(t, s, dtype), None


def _read(r: _Reader, name: str, shape: tuple[int, ...], cfg: V4Config, dtype: torch.dtype, fp8: bool,
          mxfp4: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not r.has(name):
        raise CheckpointError(f"missing tensor {name!r} (expected shape {list(shape)})")
    t = r.get(name)
    if t.dtype in (torch.int8, torch.uint8) and name.endswith(_EXPERT_PARTS):
        return _mxfp4_weight(r, name, t, shape, dtype, mxfp4)
    if tuple(t.shape) != shape:
        raise CheckpointError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)} from config.json")
    if t.dtype == FP8:
        return _fp8_weight(r, name, t, shape, cfg, dtype, fp8)
    if r.has(name + "_scale_inv"):
        raise CheckpointError(f"tensor {name + '_scale_inv'!r} scales a weight stored as {t.dtype}, "
                              "not float8_e4m3fn or packed MXFP4")
    return t, None


def load_v4(model_dir: str | Path, *, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
            backend: str | dict[str, str] = "torch", fp8: str = "dequant", mxfp4: str = "dequant", max_positions: int | None = None,
            strict: bool = True, progress: Progress | None = None) -> DeepseekV4:
    """Build the V4 model for ``config.json`` in ``model_dir`` and fill it from the checkpoint there."""
    from engine.v4.release import ReleaseReader, is_release_layout

    cfg = load_v4_config(model_dir)
    index = checkpoint_index(model_dir)
    reader = ReleaseReader(index) if is_release_layout(index) else _Reader(index)
    return _build(cfg, reader, str(model_dir), dtype=dtype, device=device,
                  backend=backend, fp8=fp8, mxfp4=mxfp4, max_positions=max_positions, strict=strict,
                  progress=progress)


def load_v4_tensors(cfg: V4Config, tensors: dict[str, torch.Tensor], **kwargs) -> DeepseekV4:
    """Like :func:`load_v4`, from HF-named tensors already in memory."""
    return _build(cfg, _DictReader(tensors), "<tensors>", **kwargs)


def _build(cfg: V4Config, r: _Reader, source: str, *, dtype: torch.dtype = torch.bfloat16,
           device: str | torch.device = "cpu", backend: str | dict[str, str] = "torch", fp8: str = "dequant",
           mxfp4: str = "dequant", max_positions: int | None = None, strict: bool = True,
           progress: Progress | None = None) -> DeepseekV4:
    for what, v in (("fp8", fp8), ("mxfp4", mxfp4)):
        if v not in ("dequant", "keep"):
            raise ValueError(f"{what} must be 'dequant' or 'keep', got {v!r}")
    device = torch.device(device)
    with torch.device("meta"):
        model = DeepseekV4(cfg, dtype=dtype, backend=backend, max_positions=max_positions)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    shapes.update({n: tuple(b.shape) for n, b in model.named_buffers()})
    model = model.to_empty(device=device)
    state: dict[str, torch.Tensor] = dict(model.named_parameters())
    state.update(dict(model.named_buffers()))
    modules = dict(model.named_modules())
    total = len(shapes)
    for done, (name, shape) in enumerate(shapes.items(), 1):
        t, s = _read(r, name, shape, cfg, dtype, fp8 == "keep", mxfp4 == "keep")
        owner, _, attr = name.rpartition(".")
        mod = modules[owner]
        if s is not None or t.dtype in (FP8, torch.int8):  # a quantised tensor replaces the dense parameter
            setattr(mod, attr, torch.nn.Parameter(t.to(device), requires_grad=False))
            if isinstance(mod, Linear):
                mod.weight_scale_inv = None if s is None else s.to(device)
            elif isinstance(mod, Experts):
                setattr(mod, attr + "_scale_inv", None if s is None else s.to(device))
        else:
            with torch.no_grad():
                state[name].copy_(t.to(state[name].dtype))
        if progress is not None:
            progress(done, total, name)
    if strict:
        used = set(shapes)
        extra = sorted(n for n in r.index if n not in used and not (n.endswith("_scale_inv")
                                                                   and n.removesuffix("_scale_inv") in used)
                       and not n.startswith("mtp."))
        if extra:
            more = f" (and {len(extra) - 5} more)" if len(extra) > 5 else ""
            raise CheckpointError(f"unexpected tensor(s) in {source} that config.json does not account for: "
                                  f"{', '.join(repr(n) for n in extra[:5])}{more}")
    model.init_rope(device)
    model.eval()
    return model
