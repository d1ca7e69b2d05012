"""Built-in pillars on the layouts of kernel repos whose kernels are not .cu files: a CuTe-DSL attention
package, a tile-language compiler (C++ passes, device templates), Triton kernel folders in an engine, a
training library's layer modules and CPU kernels."""

from __future__ import annotations

import pytest

from checks.config import default_config
from checks.pillars import PillarMatcher

LAYOUT = {
    "flash_attn/cute/flash_bwd_sm100.py": {"wiring"},  # CuTe-DSL device kernel
    "flash_attn/cute/interface.py": {"wiring"},  # its Python entry points
    "flash_attn/cute/tile_scheduler.py": {"wiring"},  # a kernel's tile scheduler, no runtime scheduler
    "include/gemm/tile_scheduler.py": {"wiring"},
    "vllm/v1/core/sched/scheduler.py": {"runtime"},
    "pkg/ops/flash_fwd_sm90.py": {"wiring"},
    "deep_gemm/legacy/sm90_bf16_gemm.py": {"wiring"},  # an arch in the name: a kernel
    "lightllm/models/vit/triton_kernel/flashattention_nopad.py": {"topology", "wiring"},
    "engine/layers/rmsnorm_kernel.py": {"topology", "wiring"},
    "src/tl_templates/cuda/copy_sm100.h": {"wiring"},  # device templates included by generated kernels
    "src/op/builtin.cc": {"wiring"},
    "src/engine/models/llama/unified_decoder.cc": {"topology"},  # a C++ engine's model layers
    "src/engine/models/llama/llama_kernels.cu": {"wiring"},
    "src/cuda/op/reduce.cc": {"wiring"},
    "src/transform/layout_inference/layout_cost_model.cc": {"wiring"},
    "te/common/triton/permutation.py": {"wiring"},  # a package of Triton kernels
    "pkg/ops/cutile/rms_norm.py": {"wiring"},
    "kt-kernel/operators/amx/moe_base.hpp": {"wiring"},  # CPU (AMX / AVX) kernels
    "te/pytorch/module/grouped_linear.py": {"topology"},  # the layers a model is built of
    "tests/cute/test_flash_attn_sm100.py": {"tests"},
    "flash_attn/cute/README.md": set(),
    "pkg/utils/smoothing.py": set(),
}


@pytest.mark.parametrize("path", sorted(LAYOUT))
def test_layout_paths_land_in_their_pillars(path):
    matcher = PillarMatcher(default_config().pillars)
    assert {pid for pid, _glob in matcher.by_path(path)} == LAYOUT[path]


def test_an_autograd_forward_in_a_dsl_kernel_package_is_no_topology():
    from checks.pillars import PillarMatcher as M

    matcher = M(default_config().pillars)
    symbol_pillars = {pid for pid, raw, name_re in matcher.symbol_patterns("flash_attn/cute/interface.py")
                      if name_re.match("FlashAttnFunc.forward")}
    assert "topology" not in symbol_pillars
    assert "topology" in {pid for pid, raw, name_re in matcher.symbol_patterns("engine/model_runner.py")
                          if name_re.match("Model.forward")}


def test_a_master_weight_cast_is_the_weight_pipeline():
    matcher = PillarMatcher(default_config().pillars)
    got = {pid for pid, _raw, name_re in matcher.symbol_patterns("te/pytorch/tensor/utils.py")
           if name_re.match("_cast_master_weights_to_fp8_mxfp8_scaling")}
    assert "weights" in got
