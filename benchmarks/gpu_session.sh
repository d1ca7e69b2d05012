#!/usr/bin/env bash
# One GPU session of measurements, in parts that each finish within ten minutes:
#   roofline: the kernel and engine tests on the GPU (compiled kernels; interpreter-only tests in their
#      subprocess), the engine decode roofline (small config, batch 1/8/32/128, torch.compile and HF
#      anchors, a profile of our step), then the FP8 GEMM / MLA tile sweep (TMA, persistent, warp-specialised);
#   heavy: the heavy kernels benchmark (parity, GEMM, MLA, MoE incl. w8a8, engine greedy), then the
#      memory-bound kernels (act_quant, weight_dequant against the copy ceiling);
#   suite: the whole test suite (pytest over 12 workers), counts in $OUT/pytest_all.log, then the MLA split
#      sweep and act_quant / weight_dequant against the copy ceiling;
#   smoke: every step with --smoke, on this machine's CPU (no GPU needed), to check the script itself.
# Outputs land in $OUT (default ./.out). Review-side wheels in .whl/ are installed when present.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./.out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"  # console tools some suites call (ast-grep, zizmor)
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cc", torch.cuda.get_device_capability())'

step() {  # step NAME SECONDS CMD...: run with a limit, keep the log, never stop the session
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s)"
  local t0=$SECONDS
  # SIGINT at the limit: pytest still prints its summary (and a benchmark its traceback); SIGKILL 15 s later.
  timeout -s INT -k 15 "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "=== $name: exit $? in $((SECONDS - t0))s"
  tail -n 40 "$OUT/$name.log"
}

case "${1:-roofline}" in
  roofline)
    command -v git ncu || true
    step pytest_gpu 170 python3 -m pytest -q -p no:cacheprovider tests/kernels tests/engine
    step roofline 230 python3 benchmarks/engine_decode.py --sections roofline --profile --time-budget 190
    step tune_heavy 170 python3 benchmarks/tune_heavy.py --budget 150
    ;;
  follow)  # after the roofline part: the GPU failures with their tracebacks, the anchors it ran out of time for
    step pytest_diag 50 python3 -m pytest -q -p no:cacheprovider --tb=short -rfs tests/engine/test_triton_backend.py \
      tests/kernels/test_fp8_quant.py tests/kernels/test_fp8_gemm.py -k "triton_backend or e4m3 or tma or paged or fp8_checkpoint"
    step roofline 160 python3 benchmarks/engine_decode.py --sections roofline --profile --compile-modes reduce-overhead \
      --compile-batches 32,128 --time-budget 140
    step tune_heavy 80 python3 benchmarks/tune_heavy.py --only gemm-decode,mla,moe --budget 65
    ;;
  heavy)
    step kernels_heavy 250 python3 benchmarks/kernels_heavy.py --budget 230 --skip "engine tok/s,engine vs HF transformers"
    step kernels_membound 120 python3 benchmarks/kernels_membound.py --budget 110 --no-compile --out /tmp/kmb
    cp /tmp/kmb/kernels_membound.json /tmp/kmb/kernels_membound.txt "$OUT/" 2>/dev/null  # not its .ptx files
    ;;
  suite)
    command -v git || echo "no git on this machine: the suites that build git repositories will fail"
    # -v: one line per test in the log, so the counts survive even a run cut off at its limit
    # pytest-benchmark (in the image, not in CI) only warns under xdist: left out, as CI runs without it
    step pytest_all "${SUITE_LIMIT:-540}" python3 -m pytest -v -p no:cacheprovider -p no:benchmark -n 12 --dist loadgroup \
      -rfEs --tb=short
    grep -Eo "(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) " "$OUT/pytest_all.log" | sort | uniq -c
    [ -n "${SUITE_ONLY:-}" ] && exit 0
    step tune_mla 40 python3 benchmarks/tune_heavy.py --only mla --budget 30
    step membound_quant 45 python3 benchmarks/kernels_membound.py --ops act_quant,weight_dequant --no-compile \
      --no-variants --budget 200 --out /tmp/kmb  # the step limit ends it; results are saved per op
    cp /tmp/kmb/kernels_membound.json /tmp/kmb/kernels_membound.txt "$OUT/" 2>/dev/null
    ;;
  smoke)
    for f in engine_decode engine_hf_layers kernels_heavy kernels_membound tune_heavy; do
      step "smoke_$f" 120 python3 "benchmarks/$f.py" --smoke
    done
    ;;
  *)
    echo "usage: $0 [roofline|follow|heavy|suite|smoke]" >&2
    exit 2
    ;;
esac
