"""Membership tests as families: ``if kind in ("a", "b")`` names the values a dispatcher accepts, like ``==``."""

from __future__ import annotations

from tests.gitrepo import GitRepo
from tests.infer.audits import audit

LOSSES = ["dapo", "grpo", "bnpo", "dr_grpo", "cispo"]


def table(names: list[str]) -> str:
    rows = "".join(f'    "{n}": {i},\n' for i, n in enumerate(names))
    return f"LOSS_TYPES = {{\n{rows}}}\n"


def dispatcher(names: list[str]) -> str:
    listed = ", ".join(f'"{n}"' for n in names)
    return f"def reduce(loss, loss_type):\n    if loss_type in ({listed}):\n        return loss.sum()\n    raise ValueError(loss_type)\n"


def files(declared: list[str], accepted: list[str]) -> dict[str, str]:
    return {"pkg/ops.py": table(declared), "pkg/loss.py": dispatcher(accepted), "pkg/__init__.py": "", "README.md": "x\n"}


def test_a_name_accepted_by_a_membership_test_but_missing_from_the_table_is_caught(tmp_path):
    r = GitRepo(tmp_path / "trainer")
    base = r.commit_files(files(LOSSES, LOSSES), "Five loss types")
    head = r.commit_files(files(LOSSES, LOSSES + ["vespo"]), "Accept vespo")
    new = audit(r.path, base, head).with_status("new")
    assert len(new) == 1, [f.message for f in new]
    assert new[0].source == "inferred" and new[0].message.startswith('"vespo" is in names compared with loss_type (pkg/loss.py:2)')
    assert "but missing from dict keys of LOSS_TYPES (pkg/ops.py:2-6)" in new[0].message


def test_the_name_added_to_both_is_quiet(tmp_path):
    r = GitRepo(tmp_path / "trainer")
    base = r.commit_files(files(LOSSES, LOSSES), "Five loss types")
    head = r.commit_files(files(LOSSES + ["vespo"], LOSSES + ["vespo"]), "Add vespo")
    found = audit(r.path, base, head)
    assert [f.message for f in found.findings] == []
    assert any("loss_type" in line for line in found.inferred)
