"""A module importing every other module of its directory is where they register: a new one must be imported there."""

from __future__ import annotations

from tests.gitrepo import GitRepo
from tests.infer.audits import audit, inferred

MODELS = ["llama", "qwen2", "gemma", "mistral"]


def model(name: str) -> str:
    return f"class {name.title()}Model:\n    arch = {name!r}\n"


def registry(names: list[str]) -> str:
    imports = "".join(f"from .{n} import {n.title()}Model\n" for n in names)
    return imports + "\nARCHITECTURES = {m.arch: m for m in [" + ", ".join(f"{n.title()}Model" for n in names) + "]}\n"


def test_a_module_the_registry_does_not_import_is_caught(tmp_path):
    r = GitRepo(tmp_path / "models")
    files = {f"pkg/arch/{n}.py": model(n) for n in MODELS}
    base = r.commit_files({**files, "pkg/arch/__init__.py": "", "pkg/arch/registry.py": registry(MODELS)}, "models")
    head = r.commit_files({"pkg/arch/phi3.py": model("phi3")}, "phi3")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1, [f.message for f in new]
    msg = new[0].message
    assert msg.startswith("`phi3` is in the modules of pkg/arch/ (pkg/arch/phi3.py:1) but missing from the modules "
                          "pkg/arch/registry.py (or another module of pkg/arch/) imports"), msg
    # Imported and registered with it: no drift; a private helper module is no model.
    done = r.commit_files({"pkg/arch/phi3.py": model("phi3"), "pkg/arch/registry.py": registry([*MODELS, "phi3"]),
                           "pkg/arch/_common.py": "EPS = 1e-6\n"}, "phi3 registered")
    assert inferred(audit(r.path, base, done)) == []
    # A helper module a model imports (by its full name) loads with it: it registers nothing of its own.
    helper = r.commit_files({"pkg/arch/custom_ops.py": "def fused_rope(x):\n    return x\n",
                             "pkg/arch/llama.py": "from pkg.arch.custom_ops import fused_rope\n\n" + model("llama")},
                            "a helper module")
    assert inferred(audit(r.path, base, helper)) == []


def test_a_directory_its_importer_covers_only_in_part_holds_no_belief(tmp_path):
    r = GitRepo(tmp_path / "models")
    files = {f"pkg/arch/{n}.py": model(n) for n in [*MODELS, "phi3"]}
    base = r.commit_files({**files, "pkg/arch/registry.py": registry(MODELS)}, "phi3 loaded lazily")
    head = r.commit_files({"pkg/arch/olmo.py": model("olmo")}, "olmo")
    assert inferred(audit(r.path, base, head)) == []
