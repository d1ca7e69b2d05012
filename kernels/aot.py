"""Compile the kernels for a chosen GPU architecture with no GPU present (Triton's bundled ptxas) and read
what came out: registers, stack bytes (spills), and the SASS instruction mix per element.

This is how the sm80 (integer e4m3 encoder), sm90 and sm120 paths are shown to build without those parts,
and how a kernel that misses the memory roofline is explained (instructions per element against the
issue rate). Run it with compiled kernels, not the interpreter::

    TRITON_INTERPRET=0 python -m kernels.aot --arch 80 90 120
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

from kernels.arch import fp8_hw_cast, interpreting

BF16 = "*bf16"


def _specs(cap: tuple[int, int]) -> list[tuple]:
    """(name, module attr, signature, constexprs, warps, elements per program) as the wrappers launch them
    on a part of capability ``cap``."""
    from kernels import fp8_quant, rmsnorm, rope, silu_mul

    hw = fp8_hw_cast(cap)
    q8 = "*fp8e4nv" if hw else "*u8"
    return [
        ("rmsnorm[fp16,plain]", rmsnorm._rmsnorm_kernel,
         {"x_ptr": "*fp16", "r_ptr": "*fp16", "w_ptr": "*fp32", "o_ptr": "*fp16", "h_ptr": "*fp16", "n_rows": "i32",
          "n_cols": "i32", "stride_x": "i32", "stride_r": "i32", "stride_o": "i32", "stride_h": "i32", "eps": "fp32"},
         {"HAS_RES": False, "ROWS": 8, "BLOCK": 512, "EXACT": False}, 4, 4096),
        ("rmsnorm", rmsnorm._rmsnorm_kernel,
         {"x_ptr": BF16, "r_ptr": BF16, "w_ptr": BF16, "o_ptr": BF16, "h_ptr": BF16, "n_rows": "i32", "n_cols": "i32",
          "stride_x": "i32", "stride_r": "i32", "stride_o": "i32", "stride_h": "i32", "eps": "fp32"},
         {"HAS_RES": True, "ROWS": 1, "BLOCK": 8192, "EXACT": False}, 8, 7168),
        ("act_quant", fp8_quant._act_quant_kernel,
         {"x_ptr": BF16, "q_ptr": q8, "s_ptr": "*fp32", "n_cols": "i32", "n_groups": "i32", "n_tiles": "i32",
          "stride_x": "i32", "stride_q": "i32", "stride_s": "i32"},
         {"QBLOCK": 128, "G": 8, "UE8M0": False, "HW_CAST": hw}, 2, 1024),
        ("weight_dequant", fp8_quant._weight_dequant_kernel,
         {"w_ptr": "*fp8e4nv" if hw else "*u8", "s_ptr": "*fp32", "o_ptr": BF16, "n_rows": "i32", "n_cols": "i32",
          "n_kb": "i32", "stride_w": "i32", "stride_s": "i32", "stride_o": "i32"},
         {"BLOCK": 128, "TILE_N": 32, "HW_CAST": hw, "EXACT": False}, 4, 4096),
        ("rope", rope._rope_kernel,
         {"x_ptr": BF16, "o_ptr": BF16, "cos_ptr": "*fp32", "sin_ptr": "*fp32", "pos_ptr": "*fp32",
          "n_rows": "i32", "n_heads": "i32", "cos_rows": "i32", "stride_xr": "i32", "stride_xh": "i32",
          "stride_or": "i32", "stride_oh": "i32", "stride_c": "i32", "stride_s": "i32"},
         {"DIM": 64, "HALF": 32, "DIM_P2": 64, "HB": 128, "BLOCK": 32, "HAS_POS": False, "WRAP": False, "EXACT": False}, 4, 2048),
        ("silu_mul", silu_mul._silu_mul_kernel,
         {"x_ptr": BF16, "o_ptr": BF16, "n_half": "i32", "stride_x": "i32", "stride_o": "i32"},
         {"BLOCK": 2048, "EXACT": False}, 8, 2048),
        ("act_dequant", fp8_quant._act_dequant_kernel,
         {"q_ptr": q8, "s_ptr": "*fp32", "o_ptr": BF16, "n_cols": "i32", "stride_q": "i32", "stride_s": "i32",
          "stride_o": "i32"},
         {"QBLOCK": 128, "G": 8, "HW_CAST": hw, "EXACT": False}, 2, 1024),
        ("rope[positions]", rope._rope_kernel,
         {"x_ptr": BF16, "o_ptr": BF16, "cos_ptr": "*fp32", "sin_ptr": "*fp32", "pos_ptr": "*i64",
          "n_rows": "i32", "n_heads": "i32", "cos_rows": "i32", "stride_xr": "i32", "stride_xh": "i32",
          "stride_or": "i32", "stride_oh": "i32", "stride_c": "i32", "stride_s": "i32"},
         {"DIM": 48, "HALF": 24, "DIM_P2": 64, "HB": 1, "BLOCK": 32, "HAS_POS": True, "WRAP": False, "EXACT": False},
         4, 2048),
        ("act_quant[ue8m0]", fp8_quant._act_quant_kernel,
         {"x_ptr": "*fp32", "q_ptr": q8, "s_ptr": "*fp32", "n_cols": "i32", "n_groups": "i32", "n_tiles": "i32",
          "stride_x": "i32", "stride_q": "i32", "stride_s": "i32"},
         {"QBLOCK": 128, "G": 8, "UE8M0": True, "HW_CAST": hw}, 2, 1024),
        ("silu_mul_quant", silu_mul._silu_mul_quant_kernel,
         {"x_ptr": BF16, "q_ptr": q8, "s_ptr": "*fp32", "n_half": "i32", "n_groups": "i32", "stride_x": "i32",
          "stride_q": "i32", "stride_s": "i32"},
         {"QBLOCK": 128, "G": 16, "UE8M0": False, "HW_CAST": hw, "EXACT": False}, 4, 2048),
    ]


def compile_one(fn, signature: dict, constexprs: dict, warps: int, cap: tuple[int, int], workdir: str, name: str):
    """Compile with 16-byte divisibility on pointers, strides and row widths (what Triton's launcher
    specialises on for real shapes); returns ``(regs, stack_bytes, sass_lines)``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    full = {n: signature.get(n, "constexpr") for n in names}
    div16 = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n in signature and (signature[n].startswith("*") or n.startswith("stride") or n in ("n_cols", "n_half"))}
    src = ASTSource(fn=fn, signature=full, constexprs={(names.index(k),): v for k, v in constexprs.items()},
                    attrs=div16)
    kernel = triton.compile(src, target=GPUTarget("cuda", cap[0] * 10 + cap[1], 32), options={"num_warps": warps})
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    cubin = os.path.join(workdir, f"{name}.cubin")
    with open(cubin, "wb") as f:
        f.write(kernel.asm["cubin"])
    usage = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", cubin],
                           capture_output=True, text=True, check=True).stdout
    regs, stack = map(int, re.search(r"REG:(\d+).*?STACK:(\d+)", usage).groups())
    sass = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-sass", cubin],
                          capture_output=True, text=True, check=True).stdout
    return regs, stack, [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]


def report(cap: tuple[int, int]) -> list[dict]:
    """One row per kernel: registers, stack, SASS instructions per element handled by a thread."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn, sig, consts, warps, elems in _specs(cap):
            regs, stack, sass = compile_one(fn, sig, consts, warps, cap, tmp, name)
            mix: dict[str, int] = {}
            for ln in sass:
                op = ln.split("*/", 1)[1].split()
                op = (op[1] if op[0].startswith("@") else op[0]).split(".")[0].rstrip(";")
                mix[op] = mix.get(op, 0) + 1
            per_thread = elems / (warps * 32)
            rows.append({"kernel": name, "arch": f"sm_{cap[0]}{cap[1]}", "regs": regs, "stack": stack,
                         "sass": len(sass), "sass_per_elem": len(sass) / per_thread,
                         "top": sorted(mix.items(), key=lambda t: -t[1])[:6]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="compile the kernels for GPU architectures without a GPU")
    ap.add_argument("--arch", nargs="+", type=int, default=[80, 90, 120], help="compute capability ×10")
    args = ap.parse_args(argv)
    if interpreting():
        print("run with TRITON_INTERPRET=0: the interpreter builds no GPU code", file=sys.stderr)
        return 2
    print(f"{'kernel':<21}{'arch':<8}{'regs':>5}{'stack':>6}{'sass':>6}{'/elem':>7}  top instructions")
    for a in args.arch:
        for r in report((a // 10, a % 10)):
            top = " ".join(f"{k}:{v}" for k, v in r["top"])
            print(f"{r['kernel']:<21}{r['arch']:<8}{r['regs']:>5}{r['stack']:>6}{r['sass']:>6}{r['sass_per_elem']:>7.1f}  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
