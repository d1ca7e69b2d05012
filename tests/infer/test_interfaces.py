"""A base class's abstract methods: every concrete subclass in another file defines them all."""

from __future__ import annotations

from tests.gitrepo import GitRepo
from tests.infer.audits import audit, inferred

METHODS = ["device_name", "synchronize", "memory_allocated", "is_bf16_supported", "use_host_timers"]


def base(abstract: bool = True) -> str:
    deco = "    @abc.abstractmethod\n" if abstract else ""
    body = "".join(f"{deco}    def {m}(self):\n        ...\n\n" for m in METHODS)
    return f"import abc\n\n\nclass Accelerator(abc.ABC):\n{body}"


def impl(name: str, methods: list[str], extra: str = "") -> str:
    body = "".join(f"    def {m}(self):\n        return '{name}.{m}'\n\n" for m in methods)
    return f"from .abstract import Accelerator\n\n\nclass {name}(Accelerator):\n{body}{extra}"


def repo(tmp_path, abstract: bool = True):
    r = GitRepo(tmp_path / "accel")
    first = r.commit_files({
        "accel/abstract.py": base(abstract),
        "accel/cpu.py": impl("CpuAccelerator", METHODS, "    def _threads(self):\n        return 4\n"),
        "accel/cuda.py": impl("CudaAccelerator", METHODS),
        "accel/mps.py": impl("MpsAccelerator", METHODS),
    }, "three accelerators")
    return r, first


def test_a_subclass_losing_an_abstract_method_is_caught(tmp_path):
    r, first = repo(tmp_path)
    head = r.commit_files({"accel/mps.py": impl("MpsAccelerator", METHODS[:-1])}, "mps: trim")
    new = inferred(audit(r.path, first, head))
    assert len(new) == 1, [f.message for f in new]
    msg = new[0].message
    assert msg.startswith("`use_host_timers` is in abstract methods of class Accelerator (accel/abstract.py:"), msg
    assert "missing from methods of class MpsAccelerator (accel/mps.py:" in msg, msg
    # A new abstract method no subclass defines is missing from each of them.
    grown = r.commit_files({"accel/abstract.py": base() + "    @abc.abstractmethod\n    def graph_pool(self):\n"
                            "        ...\n", "accel/mps.py": impl("MpsAccelerator", METHODS)}, "base: graph_pool")
    missing = inferred(audit(r.path, first, grown))
    assert len(missing) == 1 and missing[0].message.startswith("`graph_pool` is in abstract methods"), [
        f.message for f in missing]
    for where in ("CpuAccelerator (accel/cpu.py:", "CudaAccelerator (accel/cuda.py:", "MpsAccelerator (accel/mps.py:"):
        assert where in missing[0].message.partition(" but missing from ")[2], missing[0].message


def test_helpers_and_concrete_bases_are_no_interface(tmp_path):
    r, first = repo(tmp_path)
    helper = r.commit_files({"accel/cuda.py": impl("CudaAccelerator", METHODS, "    def _stream(self):\n"
                                                   "        return 0\n")}, "cuda: a helper of its own")
    assert inferred(audit(r.path, first, helper)) == []
    # The same classes over a base whose methods have bodies: a subclass may rely on the base's.
    r2, first2 = repo(tmp_path / "concrete", abstract=False)
    head = r2.commit_files({"accel/mps.py": impl("MpsAccelerator", METHODS[:-1])}, "mps: inherit use_host_timers")
    assert inferred(audit(r2.path, first2, head)) == []
