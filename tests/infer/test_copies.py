"""A table kept as a copy of another, or inside a list with a name or two more, keeps the names they share."""

from __future__ import annotations

from tests.gitrepo import GitRepo
from tests.infer.audits import audit, inferred

ARCHS = ["gfx90a", "gfx940", "gfx941", "gfx942", "gfx950", "gfx1151"]
MORE = ["gfx1100", "gfx1101", "gfx1102", "gfx1150", "gfx1200", "gfx1201", "gfx1250", "gfx1030"]


def validate(archs: list[str], var: str = "allowed_archs") -> str:
    rows = "".join(f'        "{a}",\n' for a in archs)
    return (f"def validate_archs(archs):\n    {var} = [\n{rows}    ]\n"
            f"    assert all(a in {var} for a in archs)\n    return archs\n")


def test_a_copied_list_dropping_a_name_its_original_keeps_is_caught(tmp_path):
    r = GitRepo(tmp_path / "jit")
    base = r.commit_files({"pkg/jit/core.py": validate(ARCHS + MORE), "csrc/itfs/utils.py": validate(ARCHS)},
                          "two copies of the arch check")
    head = r.commit_files({"csrc/itfs/utils.py": validate(ARCHS[:-1])}, "utils: drop gfx1151")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1, [f.message for f in new]
    msg = new[0].message
    assert msg.startswith('"gfx1151" is in list allowed_archs (pkg/jit/core.py:'), msg
    assert "missing from list allowed_archs (csrc/itfs/utils.py:" in msg, msg
    # The copy growing on its own, or both dropping a name, is no drift.
    grown = r.commit_files({"csrc/itfs/utils.py": validate(ARCHS + ["native"])}, "utils: native")
    assert inferred(audit(r.path, base, grown)) == []
    both = r.commit_files({"csrc/itfs/utils.py": validate(ARCHS[1:]), "pkg/jit/core.py": validate(ARCHS[1:] + MORE)},
                          "gfx90a gone")
    assert inferred(audit(r.path, base, both)) == []


def test_lists_alike_by_idiom_or_by_fork_may_shrink(tmp_path):
    # Not a copy: another name (8 names short of the big list, a subset by chance), a name of no telling words (an
    # autotune ``key``), or the same file in a fork of the tree (a backend's copy, which differs by design).
    r = GitRepo(tmp_path / "jit")
    base = r.commit_files({"pkg/jit/core.py": validate(ARCHS + MORE),
                           "csrc/itfs/utils.py": validate(ARCHS, var="tuned_archs"),
                           "pkg/ops/norm.py": validate(ARCHS + MORE, var="key"),
                           "pkg/ops/rope.py": validate(ARCHS, var="key"),
                           "backends/hpu/pkg/jit/core.py": validate(ARCHS)}, "a tuned subset")
    head = r.commit_files({"csrc/itfs/utils.py": validate(ARCHS[:-1], var="tuned_archs"),
                           "pkg/ops/rope.py": validate(ARCHS[:-1], var="key"),
                           "backends/hpu/pkg/jit/core.py": validate(ARCHS[:-1])}, "untune gfx1151")
    assert inferred(audit(r.path, base, head)) == []


MODELS = ["llama", "qwen2", "qwen2_moe", "minicpm", "minicpm3", "gemma", "gemma2", "phi3", "mistral", "mixtral",
          "baichuan", "bloom", "chatglm", "cohere", "deepseek_v2", "exaone", "falcon"]


def supported(models: list[str]) -> str:
    return "SUPPORTED_MODELS = [\n" + "".join(f'    "{m}",\n' for m in models) + "]\n"


def model_map(models: list[str]) -> str:
    rows = "".join(f'    "{m}": {m.title().replace("_", "")}QModel,\n' for m in models)
    return "from .definitions import *  # noqa\n\nMODEL_MAP = {\n" + rows + "}\n"


def test_a_list_losing_names_its_near_twin_map_keeps_is_caught(tmp_path):
    r = GitRepo(tmp_path / "models")
    base = r.commit_files({"pkg/models/const.py": supported(MODELS), "pkg/models/auto.py": model_map(MODELS + ["dbrx"])},
                          "models")
    # A missing comma fuses two entries into one string: both names leave the list.
    fused = supported(MODELS).replace('"minicpm3",\n    "gemma"', '"minicpm3"\n    "gemma"')
    head = r.commit_files({"pkg/models/const.py": fused}, "reorder")
    new = inferred(audit(r.path, base, head))
    assert sorted(f.message.split(" is in ")[0] for f in new) == ['"gemma"', '"minicpm3"'], [f.message for f in new]
    assert "which had only dbrx besides" in new[0].message, new[0].message
