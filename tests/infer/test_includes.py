"""A header that includes one header per task keeps including every task's header; includes alone are no list."""

from __future__ import annotations

from checks.infer.families import members
from tests.gitrepo import GitRepo
from tests.infer.audits import audit, inferred

TASKS = ["embedding", "rmsnorm", "linear", "attention", "allreduce"]


def enum(tasks: list[str]) -> str:
    return "enum TaskType {\n" + "".join(f"  TASK_{t.upper()} = {100 + i},\n" for i, t in enumerate(tasks)) + "};\n"


def task_header(tasks: list[str], extra: str = "") -> str:
    return '#pragma once\n#include "common.cuh"\n' + extra + "".join(f'#include "tasks/{t}.cuh"\n' for t in tasks)


def test_includes_are_read_by_stem():
    got = members("cuda", b'#include "common.cuh"\n#include <vector>\n  #include "tasks/rms_norm.cuh"\n')
    assert [m[2] for m in got if m[0] == "c-include"] == ["common", "rms_norm"]


def test_a_task_header_dropping_a_tasks_include_is_caught(tmp_path):
    r = GitRepo(tmp_path / "pk")
    base = r.commit_files({"include/runtime.h": enum(TASKS), "kernels/sm90/task_header.cuh": task_header(TASKS)},
                          "five tasks, one header each")
    head = r.commit_files({"kernels/sm90/task_header.cuh": task_header([t for t in TASKS if t != "linear"])},
                          "drop an include")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1, [f.message for f in new]
    assert new[0].message.startswith("`TASK_LINEAR` is in enum TaskType (include/runtime.h:"), new[0].message
    assert "missing from included headers (kernels/sm90/task_header.cuh:" in new[0].message


def test_a_helper_include_or_two_files_including_alike_is_no_drift(tmp_path):
    # Includes are only ever the bigger side: a new helper header is no name the enum lacks, and two files that
    # happen to include the same headers are no rule between them.
    r = GitRepo(tmp_path / "pk")
    base = r.commit_files({"include/runtime.h": enum(TASKS), "kernels/sm90/task_header.cuh": task_header(TASKS),
                           "kernels/sm100/task_header.cuh": task_header(TASKS)}, "two archs")
    head = r.commit_files({"kernels/sm90/task_header.cuh": task_header(TASKS, '#include "utils/pdl.cuh"\n')},
                          "sm90: a helper header")
    assert inferred(audit(r.path, base, head)) == []
