"""Load a DeepSeek-V3 HF checkpoint (safetensors shards + index) into :class:`engine.model.DeepseekV3`.

FP8 e4m3 weights come with ``<name>_scale_inv`` (one fp32 per 128×128 block). ``fp8="dequant"`` turns
them into the model dtype on load; ``fp8="keep"`` keeps fp8 weights and their scales for the w8a8 path.
Every tensor is checked against the shape the config implies; a missing, misshapen or unexpected tensor
raises :class:`CheckpointError` naming it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import torch

from engine.config import ModelConfig, load_config
from engine.model import TP, DeepseekV3, Experts, Linear
from engine.sharding import placement, shard

FP8 = torch.float8_e4m3fn
INDEX = "model.safetensors.index.json"
Progress = Callable[[int, int, str], None]


class CheckpointError(ValueError):
    """A checkpoint that does not match its config."""


def checkpoint_index(model_dir: str | Path) -> dict[str, Path]:
    """HF tensor name → the shard file holding it (from the index file, or a single model.safetensors)."""
    d = Path(model_dir)
    if not d.is_dir():
        raise CheckpointError(f"{d}: not a directory")
    idx = d / INDEX
    if idx.exists():
        try:
            weight_map = json.loads(idx.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{idx}: not a safetensors index (needs a 'weight_map' object): {exc}") from None
        files = {f: d / f for f in set(weight_map.values())}
        for f, p in files.items():
            if not p.exists():
                raise CheckpointError(f"{idx}: shard {f!r} is listed but missing from {d}")
        return {name: files[f] for name, f in weight_map.items()}
    shards = sorted(d.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"{d}: no {INDEX} and no *.safetensors files")
    from safetensors import safe_open

    out: dict[str, Path] = {}
    for p in shards:
        with safe_open(str(p), framework="pt") as f:
            for name in f.keys():
                out[name] = p
    return out


def _scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    return math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])


class _Reader:
    """Open shard files once each and hand out tensors by HF name."""

    def __init__(self, index: dict[str, Path]):
        self.index = index
        self._open: dict[Path, object] = {}
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.index

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        path = self.index[name]
        f = self._open.get(path)
        if f is None:
            f = self._open[path] = safe_open(str(path), framework="pt")
        self.used.add(name)
        return f.get_tensor(name)


class _DictReader(_Reader):
    """The same interface over tensors already in memory (benchmarks, conversions)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        super().__init__({name: Path("<memory>") for name in tensors})
        self.tensors = tensors

    def get(self, name: str) -> torch.Tensor:
        self.used.add(name)
        return self.tensors[name]


def _full_shape(name: str, local: tuple[int, ...], world: int) -> tuple[int, ...]:
    kind = placement(name)
    if world == 1 or kind == "replicated":
        return local
    dim = 0 if kind == "column" else 1
    return tuple(s * world if i == dim else s for i, s in enumerate(local))


def _targets(model: DeepseekV3) -> list[tuple[str, list[str], tuple[int, ...]]]:
    """(our parameter name, the HF names that fill it, per-HF-tensor local shape)."""
    out = []
    for name, p in model.named_parameters():
        m = re.fullmatch(r"(.*\.experts)\.(gate_proj|up_proj|down_proj)", name)
        if m:
            hf = [f"{m.group(1)}.{e}.{m.group(2)}.weight" for e in range(p.shape[0])]
            out.append((name, hf, tuple(p.shape[1:])))
        else:
            out.append((name, [name], tuple(p.shape)))
    return out


def _ignorable(name: str, cfg: ModelConfig) -> bool:
    """Checkpoint tensors the model deliberately leaves out: the MTP layers' copies of the shared
    embedding and head, MTP layers the config does not declare, and rotary caches."""
    m = re.match(r"model\.layers\.(\d+)\.", name)
    if m and int(m.group(1)) >= cfg.num_hidden_layers:
        j = int(m.group(1)) - cfg.num_hidden_layers
        if j >= cfg.num_nextn_predict_layers:
            return True
        return bool(re.search(r"\.(embed_tokens\.weight|shared_head\.head\.weight(_scale_inv)?)$", name))
    return name.endswith("rotary_emb.inv_freq")


def _read_weight(r: _Reader, name: str, shape: tuple[int, ...], cfg: ModelConfig, dtype: torch.dtype,
                 keep_fp8: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not r.has(name):
        raise CheckpointError(f"missing tensor {name!r} (expected shape {list(shape)})")
    t = r.get(name)
    if tuple(t.shape) != shape:
        raise CheckpointError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)} from config.json")
    sname = name + "_scale_inv"
    if t.dtype != FP8:
        if r.has(sname):
            raise CheckpointError(f"tensor {sname!r} scales a weight stored as {t.dtype}, not float8_e4m3fn")
        return t, None
    if not r.has(sname):
        raise CheckpointError(f"fp8 tensor {name!r} has no {sname!r} block scales")
    block = cfg.fp8_block or (128, 128)
    if block[0] != block[1]:
        raise CheckpointError(f"weight_block_size {list(block)} is not square; only square blocks are supported")
    s = r.get(sname)
    want = _scale_shape(shape, block)
    if tuple(s.shape) != want:
        raise CheckpointError(f"tensor {sname!r} has shape {list(s.shape)}, expected {list(want)} "
                              f"({block[0]}x{block[1]} blocks of {list(shape)})")
    if keep_fp8:
        return t, s.float()
    from kernels.fp8_quant import weight_dequant_ref

    return weight_dequant_ref(t, s, block=block[0], out_dtype=dtype), None


def _uses_fp8(r: _Reader, hf: str) -> bool:
    return r.has(hf + "_scale_inv")


def load_model(
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    backend: str | dict = "torch",
    fp8: str = "dequant",
    tp: TP | None = None,
    max_positions: int | None = None,
    strict: bool = True,
    progress: Progress | None = None,
) -> DeepseekV3:
    """Build the model for ``config.json`` in ``model_dir`` and fill it from the checkpoint there."""
    cfg = load_config(model_dir)
    return _build(cfg, _Reader(checkpoint_index(model_dir)), str(model_dir), dtype=dtype, device=device,
                  backend=backend, fp8=fp8, tp=tp, max_positions=max_positions, strict=strict, progress=progress)


def load_tensors(cfg: ModelConfig, tensors: dict[str, torch.Tensor], **kwargs) -> DeepseekV3:
    """Like :func:`load_model`, from HF-named tensors already in memory (same checks, same options)."""
    return _build(cfg, _DictReader(tensors), "<tensors>", **kwargs)


def _build(cfg: ModelConfig, r: _Reader, source: str, *, dtype: torch.dtype = torch.bfloat16,
           device: str | torch.device = "cpu", backend: str | dict = "torch", fp8: str = "dequant",
           tp: TP | None = None, max_positions: int | None = None, strict: bool = True,
           progress: Progress | None = None) -> DeepseekV3:
    if fp8 not in ("dequant", "keep"):
        raise ValueError(f"fp8 must be 'dequant' or 'keep', got {fp8!r}")
    tp = tp or TP()
    device = torch.device(device)
    with torch.device("meta"):
        model = DeepseekV3(cfg, dtype=dtype, backend=backend, tp=tp, max_positions=max_positions)
    keep = fp8 == "keep"
    if keep:  # fp8 Linear weights stay fp8; their modules get fp8 parameters of the same shape
        for mname, mod in model.named_modules():
            if isinstance(mod, Linear) and _uses_fp8(r, f"{mname}.weight"):
                mod.weight = torch.nn.Parameter(torch.empty(mod.weight.shape, dtype=FP8, device="meta"),
                                                requires_grad=False)
            if isinstance(mod, Experts):
                for part in ("gate_proj", "up_proj", "down_proj"):
                    if _uses_fp8(r, f"{mname}.0.{part}.weight"):
                        old = getattr(mod, part)
                        setattr(mod, part, torch.nn.Parameter(torch.empty(old.shape, dtype=FP8, device="meta"),
                                                              requires_grad=False))
    model = model.to_empty(device=device)
    model.init_rope(device)
    targets = _targets(model)
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    total = sum(len(hf) for _, hf, _ in targets)
    done = 0
    for pname, hf_names, local in targets:
        p = params[pname]
        scales = []
        for i, hf in enumerate(hf_names):
            full = _full_shape(hf, local, tp.world)
            t, s = _read_weight(r, hf, full, cfg, p.dtype, keep and p.dtype == FP8)
            t = shard(hf, t, tp.rank, tp.world)
            if s is not None:
                scales.append(shard(hf + "_scale_inv", s, tp.rank, tp.world))
            with torch.no_grad():
                (p[i] if len(hf_names) > 1 else p).copy_(t.to(p.dtype) if p.dtype != FP8 else t)
            done += 1
            if progress is not None:
                progress(done, total, hf)
        if scales:
            owner, _, attr = pname.rpartition(".")
            mod = modules[owner]
            if isinstance(mod, Experts):
                setattr(mod, f"{attr}_scale_inv", torch.stack(scales).to(device))
            else:
                mod.weight_scale_inv = scales[0].to(device)
    if strict:
        extra = sorted(n for n in r.index if n not in r.used and not _ignorable(n, cfg)
                       and not (n.endswith("_scale_inv") and n.removesuffix("_scale_inv") in r.used))
        if extra:
            more = f" (and {len(extra) - 5} more)" if len(extra) > 5 else ""
            raise CheckpointError(f"unexpected tensor(s) in {source} that config.json does not account for: "
                                  f"{', '.join(repr(n) for n in extra[:5])}{more}")
    model.fuse_projections()  # projections of one input share a weight (one GEMM each pair)
    model.eval()
    return model


def read_checkpoint(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint by HF name, fp8 weights dequantised to ``dtype`` (scales dropped)."""
    cfg = load_config(model_dir)
    r = _Reader(checkpoint_index(model_dir))
    out = {}
    for name in r.index:
        if name.endswith("_scale_inv"):
            continue
        t = r.get(name)
        if t.dtype == FP8:
            t, _ = _read_weight(r, name, tuple(t.shape), cfg, dtype, keep_fp8=False)
        out[name] = t
    return out
