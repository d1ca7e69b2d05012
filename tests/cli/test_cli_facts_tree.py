"""`drift-audit facts --tree FILE [--at LINE:COL]`: the parse tree, and a query for the node at a cursor
that then works as a fact."""

from __future__ import annotations

import json

from bot.cli import main

KERNEL = """#include "task.h"
namespace engine {
enum TaskType { TASK_ATTENTION = 101, TASK_RMSNORM = 102 };
}
"""


def test_tree_shows_types_fields_and_positions(capsys, repo):
    repo.write("src/tasks.h", KERNEL)
    repo.commit("tasks")
    (repo.root / "src/tasks.h").unlink()  # read from the commit, not the disk
    assert main(["facts", str(repo.root), "--tree", "src/tasks.h"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("translation_unit [1:1-")
    assert "  namespace_definition [2:1-4:2]" in out
    assert '        name: type_identifier [3:6-3:14] "TaskType"' in out
    assert '            value: number_literal [3:34-3:37] "101"' in out


def test_query_at_a_cursor_captures_that_node_and_its_siblings(capsys, repo):
    repo.write("src/tasks.h", KERNEL)
    repo.commit("tasks")
    assert main(["facts", str(repo.root), "--tree", "src/tasks.h", "--at", "3:17"]) == 0
    out = capsys.readouterr().out
    assert 'name: identifier [3:17-3:31] "TASK_ATTENTION"   ◀ here' in out
    query = out.strip().splitlines()[-1]
    assert query.endswith("@key)") or query.endswith("@key))")
    assert "2 capture(s) in this file" in out
    assert main(["facts", str(repo.root), "--query", query, "--lang", "cpp", "--files", "src/*.h",
                 "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)[0]["rows"]
    assert [r["key"] for r in rows] == ["TASK_ATTENTION", "TASK_RMSNORM"]


def test_bad_cursor_and_unknown_file_say_so(capsys, repo):
    repo.write("a.py", "x = 1\n")
    repo.commit("a")
    assert main(["facts", str(repo.root), "--tree", "a.py", "--at", "9:1"]) == 2
    assert "9:1 is outside the file (it has 2 lines)" in capsys.readouterr().err
    assert main(["facts", str(repo.root), "--tree", "a.py", "--at", "x"]) == 2
    assert "write LINE:COL" in capsys.readouterr().err
    assert main(["facts", str(repo.root), "--tree", "nope.py"]) == 2
    assert "no such file on disk or at HEAD" in capsys.readouterr().err
    assert main(["facts", str(repo.root), "--tree", "README"]) == 2
    assert "no grammar for README; pass --lang" in capsys.readouterr().err
