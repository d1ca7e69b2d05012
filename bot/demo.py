"""``drift-audit demo``: a sample engine repo with a realistic drifting PR, built in seconds.

The PR adds a ``topk_softmax`` task the way bring-up PRs do: the enum, the
register function, the dispatch branch, the wrapper and the sm90 kernel
include, but not the runtime's name map nor the sm100 include. The base
already carries one drift (two shard tables disagree), so the review shows a
pre-existing finding folded away beside the new ones, a CPU suite that runs,
and a GPU parity suite that this machine cannot run.
"""

from __future__ import annotations

from pathlib import Path

from checks.packs import sample

SUITES = '''
[[suite]]
id = "wrapper-unit"
kind = "unit"
command = "python -m pytest -q tests/unit"
runners = ["cpu"]
paths = ["python/**", "tests/unit/**"]

[[suite]]
id = "attention-parity"
kind = "parity"
command = "python -m pytest -q tests/gpu"
runners = ["sm90", "sm120"]
paths = ["kernels/**/*attention*"]
pillars = ["wiring"]
timeout = 600
'''

GRAPH = '''"""Threadblock graph the wrapper builds; records what each layer registers."""


class TBGraph:
    def __init__(self, grid_dim):
        self.grid_dim = grid_dim
        self.inputs = []
        self.outputs = []

    def new_input(self, tensor):
        self.inputs.append(tensor)

    def new_output(self, tensor):
        self.outputs.append(tensor)


class KernelGraph:
    def __init__(self):
        self.tasks = []

    def register_task(self, tb_graph, name, params):
        self.tasks.append((name, len(tb_graph.inputs), len(tb_graph.outputs), list(params)))
'''

UNIT_TEST = '''from engine.graph import KernelGraph
from engine.persistent_kernel import PersistentKernel


def test_each_layer_registers_its_task_once():
    kn = KernelGraph()
    pk = PersistentKernel(kn)
    for name in [n for n in dir(pk) if n.endswith("_layer")]:
        layer = getattr(pk, name)
        n_inputs = layer.__code__.co_argcount - 3  # self, out, residual
        layer(*range(n_inputs), out="y")
    names = [t[0] for t in kn.tasks]
    assert len(names) == len(set(names))
    assert all(t[2] >= 1 for t in kn.tasks)  # every task writes an output
'''

GPU_TEST = '''import pytest

torch = pytest.importorskip("torch")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_decode_attention_matches_reference():
    q = torch.randn(64, device="cuda")
    assert torch.allclose(q.clone(), q)
'''


def _files(tasks) -> dict[str, str]:
    files = sample.files_for(tasks)
    files[".github/drift-audit.toml"] += SUITES
    files["python/engine/__init__.py"] = ""
    files["python/engine/graph.py"] = GRAPH
    files["tests/unit/test_wrapper.py"] = UNIT_TEST
    files["tests/gpu/test_attention_parity.py"] = GPU_TEST
    files["pytest.ini"] = "[pytest]\npythonpath = python\n"
    return files


def demo_trees() -> tuple[dict[str, str], dict[str, str]]:
    """(base files, head files) of the demo PR, for building it on top of other history too."""
    base = _files(sample.TASKS)
    base["scripts/demo.py"] = base["scripts/demo.py"].replace('"wo": ("row", 1)', '"wo": ("col", 1)')
    head = _files(sample.TASKS[:4] + [("topk_softmax", 105, 2, 1, 3)] + sample.TASKS[4:])
    head["scripts/demo.py"] = base["scripts/demo.py"]
    head["src/runtime.cc"] = head["src/runtime.cc"].replace(
        '  task_type_to_name[TASK_TOPK_SOFTMAX] = "TASK_TOPK_SOFTMAX";\n', "")
    head["kernels/sm100/task_header.cuh"] = head["kernels/sm100/task_header.cuh"].replace(
        '#include "topk_softmax.cuh"\n', "")
    head["kernels/sm90/decode_attention.cuh"] = head["kernels/sm90/decode_attention.cuh"].replace(
        "out[threadIdx.x] = q[threadIdx.x];", "out[threadIdx.x] = q[threadIdx.x] * 1.0f;")
    return base, head


def build_demo_repo(root: Path) -> tuple[str, str]:
    """Write the sample repo at ``root``; returns (base sha, head sha) of the demo PR."""
    repo = sample.init_repo(Path(root))
    base, head = demo_trees()
    base_sha = sample.commit(repo, base, "Engine with five tasks")
    head_sha = sample.commit(repo, head, "Add the topk_softmax task")
    return base_sha, head_sha
