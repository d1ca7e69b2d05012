"""Built-in pillars on the layouts of kernel repos whose kernels are not .cu files: a CuTe-DSL attention
package, a tile-language compiler (C++ passes, device templates), Triton kernel folders in an engine."""

from __future__ import annotations

import pytest

from checks.config import default_config
from checks.pillars import PillarMatcher

LAYOUT = {
    "flash_attn/cute/flash_bwd_sm100.py": {"wiring"},  # CuTe-DSL device kernel
    "flash_attn/cute/interface.py": {"wiring"},  # its Python entry points
    "pkg/ops/flash_fwd_sm90.py": {"wiring"},
    "deep_gemm/legacy/sm90_bf16_gemm.py": {"wiring"},  # an arch in the name: a kernel
    "lightllm/models/vit/triton_kernel/flashattention_nopad.py": {"topology", "wiring"},
    "engine/layers/rmsnorm_kernel.py": {"topology", "wiring"},
    "src/tl_templates/cuda/copy_sm100.h": {"wiring"},  # device templates included by generated kernels
    "src/op/builtin.cc": {"wiring"},
    "src/cuda/op/reduce.cc": {"wiring"},
    "src/transform/layout_inference/layout_cost_model.cc": {"wiring"},
    "tests/cute/test_flash_attn_sm100.py": {"tests"},
    "flash_attn/cute/README.md": set(),
    "pkg/utils/smoothing.py": set(),
}


@pytest.mark.parametrize("path", sorted(LAYOUT))
def test_layout_paths_land_in_their_pillars(path):
    matcher = PillarMatcher(default_config().pillars)
    assert {pid for pid, _glob in matcher.by_path(path)} == LAYOUT[path]
