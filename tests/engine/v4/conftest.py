"""One random tiny V4 checkpoint per session, loaded into our engine and into HF's DeepseekV4ForCausalLM.

fp32 on CPU, so the two differ only in the order of fp32 reductions and any real disagreement stands
far above that noise."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def v4_dir(tmp_path_factory):
    from engine.v4.tiny import write_tiny

    return write_tiny(tmp_path_factory.mktemp("v4") / "ckpt", seed=0)


@pytest.fixture(scope="session")
def v4_model(v4_dir):
    from engine.v4.loader import load_v4

    return load_v4(v4_dir, dtype=torch.float32)


@pytest.fixture(scope="session")
def hf_v4(v4_dir):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "DeepseekV4ForCausalLM"):
        pytest.skip(f"transformers {transformers.__version__} has no DeepseekV4ForCausalLM (the test extra pins one)")
    from transformers.utils import logging

    logging.set_verbosity_error()
    return transformers.DeepseekV4ForCausalLM.from_pretrained(
        str(v4_dir), dtype=torch.float32, attn_implementation="eager", local_files_only=True).eval()


@pytest.fixture(scope="session")
def v4_prompts():
    g = torch.Generator().manual_seed(7)
    return [torch.randint(2, 256, (n,), generator=g).tolist() for n in (5, 13, 9)]
