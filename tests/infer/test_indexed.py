"""A table as long as the enum indexing it, named alike (display names, not the members' names)."""

from __future__ import annotations

from tests.gitrepo import GitRepo
from tests.infer.audits import audit, inferred

METHODS = ["EULER", "EULER_A", "HEUN", "DPM2", "DPMPP2M", "LCM", "DDIM", "TCD"]
SHOWN = ["Euler", "Euler A", "Heun", "DPM2", "DPM++ (2M)", "LCM", "DDIM", "TCD"]


def header(members: list[str], name: str = "sample_method_t") -> str:
    rows = "".join(f"    {m}_SAMPLE_METHOD,\n" for m in members)
    return f"enum {name} {{\n{rows}    SAMPLE_METHOD_COUNT\n}};\n"


def source(shown: list[str], name: str = "sampling_methods_str") -> str:
    rows = "".join(f'    "{s}",\n' for s in shown)
    return (f'#include "sd.h"\n\nconst char* {name}[] = {{\n{rows}}};\n\n'
            f"const char* method_name(int m) {{ return {name}[m]; }}\n")


def test_an_enum_member_without_its_table_entry_is_caught(tmp_path):
    r = GitRepo(tmp_path / "sd")
    base = r.commit_files({"include/sd.h": header(METHODS), "src/sd.cpp": source(SHOWN)}, "samplers")
    head = r.commit_files({"include/sd.h": header([*METHODS, "ER_SDE"])}, "er_sde sampler")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1, [f.message for f in new]
    msg = new[0].message
    assert msg.startswith("array sampling_methods_str (src/sd.cpp:"), msg
    assert "has no entry for `ER_SDE_SAMPLE_METHOD`, position 9 of enum sample_method_t (include/sd.h:10)" in msg, msg
    both = r.commit_files({"include/sd.h": header([*METHODS, "ER_SDE"]), "src/sd.cpp": source([*SHOWN, "ER-SDE"])},
                          "er_sde with its name")
    assert inferred(audit(r.path, base, both)) == []


def test_an_unrelated_table_of_the_same_length_holds_no_belief(tmp_path):
    r = GitRepo(tmp_path / "sd")
    base = r.commit_files({"include/sd.h": header(METHODS),
                           "src/sd.cpp": source(["a", "b", "c", "d", "e", "f", "g", "h"], name="weight_files")},
                          "eight of each")
    head = r.commit_files({"include/sd.h": header([*METHODS, "ER_SDE"])}, "er_sde sampler")
    assert inferred(audit(r.path, base, head)) == []
