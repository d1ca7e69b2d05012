#!/usr/bin/env bash
# One GPU session of measurements, in parts that each finish within ten minutes:
#   a: the runner's GPU side on this machine's label (every parity and decode suite of
#      .github/drift-audit.toml through `runner execute`), then the memory-bound kernels benchmark;
#   b: the heavy kernels benchmark (FP8 GEMM, MoE, MLA decode, engine Triton decode), then the
#      engine decode benchmark against HF transformers with the bf16 parity check;
#   c: the engine against HF layer by layer (bf16 and fp32), then the heavy kernels benchmark again;
#   final: the runner's sm90 suites, the heavy kernels and the engine decode benchmark, in one call.
# Outputs land in $OUT (default ./.out). Review-side wheels in .whl/ are installed when present.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./.out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cc", torch.cuda.get_device_capability())'

step() {  # step NAME SECONDS CMD...: run with a limit, keep the log, never stop the session
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "=== $name: exit $? in $((SECONDS - t0))s"
  tail -n 40 "$OUT/$name.log"
}

case "${1:-a}" in
  a)
    step runner_sm90 260 runner/gpu_smoke.sh sm90 "$OUT"
    step kernels_membound 230 python3 benchmarks/kernels_membound.py
    ;;
  b)
    step kernels_heavy 280 python3 benchmarks/kernels_heavy.py
    step engine_decode 260 python3 benchmarks/engine_decode.py
    ;;
  final)
    step runner_sm90 200 runner/gpu_smoke.sh sm90 "$OUT"
    step kernels_heavy 250 python3 benchmarks/kernels_heavy.py
    step engine_decode 200 python3 benchmarks/engine_decode.py
    ;;
  c)
    step engine_hf_layers 200 python3 benchmarks/engine_hf_layers.py --device cuda
    step kernels_heavy 280 python3 benchmarks/kernels_heavy.py
    ;;
esac
