"""Shared fixtures: one random tiny checkpoint per session, loaded into our engine and into HF transformers.

float32 on CPU: both implementations then differ only by the order of fp32 reductions (~1e-6 relative),
so any real disagreement stands far above the noise instead of hiding in bf16 rounding.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.interpreter import KERNEL_DEVICE, configure, group, pyfunc_call


def pytest_configure(config):
    configure(config)


def pytest_collection_modifyitems(config, items):
    group(items)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    return pyfunc_call(pyfuncitem)


@pytest.fixture(scope="session")
def kernel_device() -> str:
    """Where this process's Triton kernels run: ``cuda`` where they compile, else ``cpu`` (interpreter)."""
    return KERNEL_DEVICE


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from engine.tiny import write_tiny

    return write_tiny(tmp_path_factory.mktemp("tiny") / "ckpt", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    from engine.loader import load_model

    return load_model(tiny_dir, dtype=torch.float32)


@pytest.fixture(scope="session")
def hf_model(tiny_dir):
    transformers = pytest.importorskip("transformers")
    from transformers.utils import logging

    logging.set_verbosity_error()  # the MTP layer is "unexpected" to HF; it ignores it
    return transformers.DeepseekV3ForCausalLM.from_pretrained(
        str(tiny_dir), dtype=torch.float32, attn_implementation="eager", local_files_only=True).eval()


@pytest.fixture(scope="session")
def prompts():
    g = torch.Generator().manual_seed(7)
    return [torch.randint(2, 256, (n,), generator=g).tolist() for n in (5, 11, 8)]
