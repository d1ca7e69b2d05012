"""V4 config and checkpoint loading: quantised layouts (fp8 blocks, MXFP4 experts), and errors that name
the field or tensor."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from engine.config import ConfigError
from engine.loader import CheckpointError
from engine.v4.config import parse_v4_config
from engine.v4.generate import generate, prefill_logits
from engine.v4.loader import load_v4
from engine.v4.tiny import TINY, write_tiny


def test_config_reads_every_v4_field():
    c = parse_v4_config(TINY)
    assert c.layer_types[1] == "compressed_sparse_attention" and c.compress_rate(2) == 8 and c.compress_rate(0) == 0
    assert c.mlp_layer_types[:2] == ("hash_moe", "hash_moe") and c.qk_rope_head_dim == 8
    assert c.yarn is not None and c.yarn.factor == 4.0 and c.compress_rope_theta == 160000.0
    assert (c.hc_mult, c.hc_sinkhorn_iters, c.o_groups, c.index_topk) == (4, 20, 2, 3)


def test_config_folds_legacy_fields_like_hf():
    d = {k: v for k, v in TINY.items() if k not in ("layer_types", "mlp_layer_types", "compress_rates",
                                                     "partial_rotary_factor")}
    c = parse_v4_config(dict(d, compress_ratios=[0, 4, 128, 4], num_hash_layers=1, qk_rope_head_dim=8,
                             compress_rate_hca=16))
    assert c.layer_types == ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                             "compressed_sparse_attention")
    assert c.mlp_layer_types == ("hash_moe", "moe", "moe", "moe") and c.compress_rate(2) == 16
    assert c.qk_rope_head_dim == 8


@pytest.mark.parametrize("field,value,needle", [
    ("layer_types", ["sliding_attention", "dense"], "layer_types"),
    ("mlp_layer_types", ["moe"], "mlp_layer_types"),
    ("scoring_func", "relu", "scoring_func"),
    ("o_groups", 3, "o_groups"),
    ("index_head_dim", 4, "index_head_dim"),
    ("hc_mult", "four", "hc_mult"),
    ("model_type", "deepseek_v3", "model_type"),
])
def test_config_errors_name_the_field(field, value, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_v4_config(dict(TINY, **{field: value}), "ckpt/config.json")


@pytest.fixture(scope="module")
def quant_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("v4q")
    return {"fp32": write_tiny(base / "fp32", seed=0), "mx": write_tiny(base / "mx", seed=0, mxfp4=True),
            "fp8mx": write_tiny(base / "fp8mx", seed=0, fp8=True, mxfp4=True)}


def test_mxfp4_checkpoint_dequantised_and_kept_agree(quant_dirs):
    tokens = torch.randint(2, 256, (2, 24), generator=torch.Generator().manual_seed(5))
    deq = load_v4(quant_dirs["mx"], dtype=torch.float32)
    kept = load_v4(quant_dirs["mx"], dtype=torch.float32, mxfp4="keep")
    ex = kept.model.layers[0].mlp.experts
    assert ex.gate_up_proj.dtype == torch.int8 and ex.gate_up_proj_scale_inv.dtype == torch.float8_e8m0fnu
    a, b = prefill_logits(deq, tokens), prefill_logits(kept, tokens)
    assert (a - b).abs().max().item() < 1e-4
    dense = prefill_logits(load_v4(quant_dirs["fp32"], dtype=torch.float32), tokens)
    assert 1e-3 < (a - dense).abs().max().item()  # the checkpoint really is quantised


def test_fp8_checkpoint_keep_and_qat_paths(quant_dirs):
    deq = load_v4(quant_dirs["fp8mx"], dtype=torch.float32)
    kept = load_v4(quant_dirs["fp8mx"], dtype=torch.float32, fp8="keep", mxfp4="keep")
    attn = kept.model.layers[1].self_attn
    assert attn.q_a_proj.weight.dtype == torch.float8_e4m3fn and attn.q_a_proj.weight_scale_inv is not None
    assert attn.compressor.kv_proj.weight.dtype == torch.float32  # V4 ships compressor projections in bf16
    tokens = torch.randint(2, 256, (1, 20), generator=torch.Generator().manual_seed(6))
    a, b = prefill_logits(deq, tokens), prefill_logits(kept, tokens)
    assert (a - b).abs().max().item() < 1e-4
    kept.set_qat(True)
    q = prefill_logits(kept, tokens)
    rel = ((q - a).norm() / a.norm()).item()  # e4m3 activations: ~2-3% per GEMM, a few % after 4 layers
    assert 1e-3 < rel < 0.15, rel


def _edit(src, dst, fn):
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    tensors = {}
    for f in src.glob("*.safetensors"):
        tensors.update(load_file(str(f)))
    fn(tensors)
    save_file(tensors, str(dst / "model.safetensors"))


def test_checkpoint_errors_name_the_tensor(quant_dirs, tmp_path):
    src = quant_dirs["mx"]
    name = "model.layers.1.self_attn.compressor.indexer.q_b_proj.weight"
    _edit(src, tmp_path / "a", lambda t: t.__setitem__(name, t[name][:, :-1].clone()))
    with pytest.raises(CheckpointError, match=r"q_b_proj\.weight.*expected"):
        load_v4(tmp_path / "a", dtype=torch.float32)
    _edit(src, tmp_path / "b", lambda t: t.pop("model.layers.2.mlp.gate.e_score_correction_bias"))
    with pytest.raises(CheckpointError, match="missing tensor 'model.layers.2.mlp.gate.e_score_correction_bias'"):
        load_v4(tmp_path / "b", dtype=torch.float32)
    sname = "model.layers.0.mlp.experts.down_proj_scale_inv"
    _edit(src, tmp_path / "c", lambda t: t.__setitem__(sname, t[sname][..., :-1].clone()))
    with pytest.raises(CheckpointError, match="down_proj_scale_inv.*one per 32"):
        load_v4(tmp_path / "c", dtype=torch.float32)
    _edit(src, tmp_path / "d", lambda t: t.__setitem__("model.layers.9.extra", torch.zeros(1)))
    with pytest.raises(CheckpointError, match="unexpected tensor.*layers.9.extra"):
        load_v4(tmp_path / "d", dtype=torch.float32)


def test_ragged_batch_equals_one_prompt_at_a_time(v4_model):
    model = v4_model
    prompts = [[5, 9, 77], list(range(20, 41)), [3] * 10]
    batch = generate(model, prompts, 8)
    for g, p in zip(batch, prompts, strict=True):
        assert generate(model, [p], 8)[0].tokens == g.tokens


def test_cli_tiny_arch_v4(tmp_path):
    out = tmp_path / "t"
    r = subprocess.run([sys.executable, "-m", "bot.cli", "engine", "tiny", str(out), "--arch", "deepseek_v4",
                        "--mxfp4", "--set", '{"num_hidden_layers": 2, "layer_types": ["sliding_attention", '
                        '"compressed_sparse_attention"], "mlp_layer_types": ["hash_moe", "moe"]}'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v4" and cfg["quantization_config"]["expert_dtype"] == "fp4"
    assert load_v4(out, dtype=torch.float32, mxfp4="keep").cfg.num_hidden_layers == 2
    bad = subprocess.run([sys.executable, "-m", "bot.cli", "engine", "tiny", str(tmp_path / "u"), "--arch",
                          "deepseek_v4", "--set", '{"o_groups": 3}'], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "o_groups" in bad.stderr and "Traceback" not in bad.stderr


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory):
    """The tiny model with V4's real 512-wide head (448 nope + 64 rope), so the 584-byte pool applies."""
    return write_tiny(tmp_path_factory.mktemp("v4w") / "ckpt", seed=0, head_dim=512, partial_rotary_factor=0.125,
                      num_attention_heads=2, o_groups=2, index_head_dim=64)


def test_fp8_pool_decode_tracks_dense_decode(wide_dir, v4_model):
    model = load_v4(wide_dir, dtype=torch.float32)
    prompts = [[5, 9, 13], list(range(30, 47))]
    dense = generate(model, prompts, 2)
    fp8 = generate(model, prompts, 2, kv="fp8")
    assert [g.tokens[0] for g in dense] == [g.tokens[0] for g in fp8]  # prefill is exact in both
    # the first decode step reads every key back from e4m3 tiles: close to dense, not equal
    gaps = [abs(a.margins[1] - b.margins[1]) for a, b in zip(dense, fp8, strict=True)]
    assert 0 < max(gaps) < 1.0, gaps
    with pytest.raises(ValueError, match="448 nope"):  # the 32-wide tiny head has no 584-byte layout
        v4_model.setup_cache(1, 8, "fp8")


def test_fp8_pool_decode_triton_kernels_match_reference(wide_dir, kernel_device):
    ref = load_v4(wide_dir, dtype=torch.float32, device=kernel_device)
    tri = load_v4(wide_dir, dtype=torch.float32, device=kernel_device,
                  backend={"default": "torch", "sparse_decode": "triton", "kv_pack": "triton"})
    prompts = [list(range(30, 42))]
    a = generate(ref, prompts, 3, kv="fp8")[0]
    b = generate(tri, prompts, 3, kv="fp8")[0]
    assert tri.ops.resolved()["sparse_decode"] == "triton"
    assert a.tokens == b.tokens and max(abs(x - y) for x, y in zip(a.margins, b.margins, strict=True)) < 1e-3


def test_op_table_backends_per_op_and_errors():
    from engine.v4.ops import OPS, V4Ops

    ops = V4Ops({"default": "torch", "hc_pre": "triton"})
    used = ops.resolved()
    assert used["hc_pre"] == "triton" and used["hc_post"] == "torch" and set(used) == set(OPS)
    assert V4Ops("triton").resolved()["hc_head"] == "torch"  # no Triton kernel: the reference, and it says so
    with pytest.raises(ValueError, match="unknown op"):
        V4Ops({"hc_prefix": "triton"})
    with pytest.raises(ValueError, match="backend must be one of"):
        V4Ops("cuda")


# HF name -> DeepSeek's release name, written here independently of engine/v4/release.py (HF's own loader,
# which renames release checkpoints itself, is the oracle below)
_TO_RELEASE = [
    (r"^model\.", ""), (r"^embed_tokens\.weight$", "embed.weight"), (r"^lm_head\.weight$", "head.weight"),
    (r"^hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"), (r"\.input_layernorm\.", ".attn_norm."),
    (r"\.post_attention_layernorm\.", ".ffn_norm."), (r"\.attn_hc\.(fn|base|scale)$", r".hc_attn_\1"),
    (r"\.ffn_hc\.(fn|base|scale)$", r".hc_ffn_\1"), (r"\.sinks$", ".attn_sink"),
    (r"\.compressor\.indexer\.scorer\.weights_proj\.", ".indexer.weights_proj."),
    (r"\.compressor\.indexer\.q_b_proj\.", ".indexer.wq_b."), (r"\.compressor\.indexer\.", ".indexer.compressor."),
    (r"\.self_attn\.q_b_proj\.", ".self_attn.wq_b."), (r"\.q_a_proj\.", ".wq_a."), (r"\.o_a_proj\.", ".wo_a."),
    (r"\.o_b_proj\.", ".wo_b."), (r"\.q_a_norm\.", ".q_norm."), (r"\.position_bias$", ".ape"),
    (r"\.shared_experts\.gate_proj\.", ".shared_experts.w1."), (r"\.shared_experts\.down_proj\.", ".shared_experts.w2."),
    (r"\.shared_experts\.up_proj\.", ".shared_experts.w3."), (r"(compressor(\.indexer)?)\.kv_proj\.", r"\1.wkv."),
    (r"(compressor(\.indexer)?)\.gate_proj\.", r"\1.wgate."), (r"(compressor(\.indexer)?)\.kv_norm\.", r"\1.norm."),
    (r"self_attn\.kv_proj\.", "self_attn.wkv."), (r"\.gate\.e_score_correction_bias$", ".gate.bias"),
    (r"\.self_attn\.", ".attn."), (r"\.mlp\.", ".ffn."),
]


def test_release_layout_loads_like_hf_loads_it(tmp_path, hf_v4):
    import re

    import transformers

    from engine.tiny import save_checkpoint
    from engine.v4.generate import prefill_logits
    from engine.v4.tiny import random_weights

    out = {}
    for name, t in random_weights(TINY, seed=4).items():
        m = re.match(r"model\.(layers\.\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$", name)
        if m:  # per-expert w1 (gate), w3 (up), w2 (down)
            for e in range(t.shape[0]):
                if m.group(2) == "down_proj":
                    out[f"{m.group(1)}.ffn.experts.{e}.w2.weight"] = t[e].clone()
                else:
                    half = t.shape[1] // 2
                    out[f"{m.group(1)}.ffn.experts.{e}.w1.weight"] = t[e, :half].clone()
                    out[f"{m.group(1)}.ffn.experts.{e}.w3.weight"] = t[e, half:].clone()
            continue
        for pat, rep in _TO_RELEASE:
            name = re.sub(pat, rep, name)
        out[name] = t
    assert "layers.1.attn.indexer.compressor.wkv.weight" in out and "embed.weight" in out
    d = save_checkpoint(tmp_path / "release", dict(TINY), out)
    ours = load_v4(d, dtype=torch.float32)
    hf = transformers.DeepseekV4ForCausalLM.from_pretrained(str(d), dtype=torch.float32, attn_implementation="eager",
                                                             local_files_only=True).eval()
    tokens = torch.randint(2, 256, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(tokens, use_cache=False).logits
    assert (prefill_logits(ours, tokens) - ref).abs().max().item() < 1e-4
