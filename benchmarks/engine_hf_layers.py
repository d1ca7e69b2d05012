"""Where do our engine and HF transformers part ways? Layer-by-layer hidden states on the same weights.

    PYTHONPATH=. python3 benchmarks/engine_hf_layers.py [--device cuda] [--dtypes bfloat16,float32]
    python benchmarks/engine_hf_layers.py --smoke        # tiny preset, fp32, CPU: the script runs

For each preset and dtype: the same random checkpoint in both models, one batch of prompts, and per
decoder layer the max |Δ| and cosine of the outputs, plus, for MoE layers, the share of (token, slot)
expert choices that differ. A bf16 gap that starts at one layer and grows points at that layer's op; a
gap that tracks routing flips is rounding turned into a different expert.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engine_decode import hf_model  # noqa: E402
from engine.config import parse_config  # noqa: E402
from engine.loader import load_tensors  # noqa: E402
from engine.tiny import PRESETS, random_weights  # noqa: E402


def _capture(modules, store: list, pick):
    hooks = []
    for i, m in enumerate(modules):
        def hook(_m, _inp, out, i=i):
            store.append((i, pick(out).detach().float()))
        hooks.append(m.register_forward_hook(hook))
    return hooks


@torch.inference_mode()
def compare(preset: str, dtype: torch.dtype, device: torch.device, prompt_len: int, batch: int) -> list[str]:
    cfg_dict = dict(PRESETS[preset], num_nextn_predict_layers=0)
    tensors = random_weights(cfg_dict, seed=0, dtype=dtype, device=device)
    ours = load_tensors(parse_config(cfg_dict, preset), tensors, dtype=dtype, device=device, backend="torch",
                        max_positions=prompt_len + 8)
    hf = hf_model(cfg_dict, tensors, dtype, device)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(2, cfg_dict["vocab_size"], (batch, prompt_len), generator=gen).to(device)

    theirs_out: list = []
    ours_out: list = []
    hooks = _capture(hf.model.layers, theirs_out, lambda o: o[0] if isinstance(o, tuple) else o)
    hooks += _capture(ours.decoder_layers, ours_out, lambda o: o)
    hf_routes: list = []
    our_routes: list = []
    for layer in hf.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None:
            hooks.append(gate.register_forward_hook(lambda _m, _i, o: hf_routes.append(o[-1])))  # (logits, w, ids)
    for layer in ours.decoder_layers:
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if gate is not None:
            hooks.append(gate.register_forward_hook(lambda _m, _i, o: our_routes.append(o[1])))  # (w, ids)

    ref = hf(ids).logits.float()
    ours.setup_cache(batch, prompt_len, "naive")
    pos = torch.arange(prompt_len, device=device).unsqueeze(0).expand(batch, prompt_len)
    got = ours.head(ours.hidden(ids, pos))
    for h in hooks:
        h.remove()

    lines = [f"{preset} {str(dtype).removeprefix('torch.')} {device.type}: logits max|Δ| "
             f"{(got - ref).abs().max().item():.4g} of {ref.abs().max().item():.3g}, cosine "
             f"{torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0).item():.6f}"]
    for (i, a), (_, b) in zip(theirs_out, ours_out):
        b = b.reshape(a.shape)
        cos = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()
        lines.append(f"  layer {i:2d}: max|Δ| {(a - b).abs().max().item():.4g} of {a.abs().max().item():.3g}, "
                     f"cosine {cos:.6f}")
    for k, (a, b) in enumerate(zip(hf_routes, our_routes)):
        if a.shape == b.shape and a.dtype == b.dtype and not a.is_floating_point():
            diff = (a.sort(-1).values != b.sort(-1).values).float().mean().item()
            lines.append(f"  moe {k}: expert choices differing {diff:.2%}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--smoke", action="store_true", help="tiny preset, float32, CPU (CI)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.device, args.dtypes, args.presets, args.batch = "cpu", "float32", "tiny", 2
    device = torch.device(args.device)
    failed = 0
    for preset in args.presets.split(","):
        for name in args.dtypes.split(","):
            try:
                for line in compare(preset, getattr(torch, name), device, args.prompt_len, args.batch):
                    print(line, flush=True)
            except Exception as exc:  # one preset/dtype that breaks must not hide the others
                print(f"section error: {preset} {name}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
