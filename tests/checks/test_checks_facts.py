"""Fact extraction: captures and predicates, scopes, counts, transforms, regex, and bad input."""

from __future__ import annotations

import pytest

from checks.config import Fact
from checks.facts import FactError, extract, extract_text
from checks.packs import sample as shape
from checks.workspace import Tree

CPP = b"""
enum TaskType { TASK_BEGIN = 0, TASK_A = 101, TASK_B = 102, TASK_END = 199 };
enum Other { OTHER_X = 1 };
int dispatch(int task_type) {
  if (task_type == TASK_A) { return 1; } else if (task_type == TASK_B) { return 2; }
  if (ready) { return 3; }
  return 0;
}
int helper() { return TASK_A; }
"""


def keys(fact, data=CPP, path="x.h"):
    rows, problem = extract_text(fact, path, data)
    assert problem is None
    return [r.key for r in rows]


def test_query_captures_predicates_and_ignore():
    f = Fact("e", "cpp", ["*.h"], query='(enumerator name: (identifier) @key (#match? @key "^TASK_"))', options={"ignore": ["*_BEGIN", "*_END"]})
    assert keys(f) == ["TASK_A", "TASK_B"]


@pytest.mark.parametrize(
    "scope, expected",
    [
        ("enum:TaskType", ["TASK_BEGIN", "TASK_A", "TASK_B", "TASK_END"]),
        ("enum:Oth*", ["OTHER_X"]),
        ("function:dispatch", ["task_type", "TASK_A", "task_type", "TASK_B", "ready"]),
        ("if-chain:TASK_A", ["task_type", "TASK_A", "task_type", "TASK_B"]),
    ],
)
def test_scopes(scope, expected):
    query = "(enumerator name: (identifier) @key)" if scope.startswith("enum") else "(condition_clause (_ (identifier) @key))\n(condition_clause (identifier) @key)"
    f = Fact("s", "cpp", ["*.h"], query=query, options={"scope": scope})
    assert keys(f) == expected


def test_regex_fact_lines_values_and_index_keys():
    f = Fact("r", "regex", ["*"], regex=r'^(?P<key>\w+)\s*=\s*(?P<value>\d+)$')
    rows, _ = extract_text(f, "c.py", b"# header\nA = 1\nB = 22\n")
    assert [(r.key, r.values, r.line) for r in rows] == [("A", {"value": "1"}, 2), ("B", {"value": "22"}, 3)]
    g = Fact("l", "python", ["*.py"], query="(list (_) @value)", options={"key": "@index"})
    rows, _ = extract_text(g, "l.py", b"X = ['a', 'b']\n")
    assert [(r.key, r.values["value"]) for r in rows] == [("0", "a"), ("1", "b")]


def test_len_counts_elements_and_unquote_can_be_turned_off():
    f = Fact("p", "python", ["*.py"], query='(call arguments: (argument_list (string) @key (list) @n))', options={"len": ["n"]})
    rows, _ = extract_text(f, "w.py", b'reg("x", [1, 2, 3])\n')
    assert (rows[0].key, rows[0].values["n"]) == ("x", 3)
    g = Fact("q", "python", ["*.py"], query='(call arguments: (argument_list (string) @key))', options={"unquote": False})
    assert keys(g, b'reg("x")\n', "w.py") == ['"x"']


def test_bad_options_and_queries_name_the_fact():
    with pytest.raises(FactError, match=r"fact 'q'.*query does not compile"):
        extract_text(Fact("q", "cpp", ["*"], query="(enumerator name: (nosuchnode) @key)"), "x.h", CPP)
    with pytest.raises(FactError, match=r"no @key capture"):
        extract_text(Fact("k", "cpp", ["*"], query="(enumerator) @name"), "x.h", CPP)
    with pytest.raises(FactError, match=r"scope 'loop:x' must be KIND:NAME"):
        extract_text(Fact("s", "cpp", ["*"], query="(identifier) @key", options={"scope": "loop:x"}), "x.h", CPP)
    with pytest.raises(FactError, match=r"unknown option 'scop'"):
        extract_text(Fact("o", "cpp", ["*"], query="(identifier) @key", options={"scop": "enum:T"}), "x.h", CPP)


def test_parse_errors_are_reported_with_a_line_and_rows_still_come():
    f = Fact("e", "cpp", ["*.h"], query="(enumerator name: (identifier) @key)")
    rows, problem = extract_text(f, "x.h", b"enum T { TASK_A, TASK_B };\n\nint f( {\n")
    assert [r.key for r in rows] == ["TASK_A", "TASK_B"]
    assert problem.startswith("x.h:3: cpp syntax error")


def test_rows_are_read_from_git_objects_and_cached_by_blob(tmp_path):
    repo = shape.init_repo(tmp_path / "r")
    sha = shape.commit(repo, {"a/x.h": "enum T { TASK_A };\n", "b/y.h": "enum T { TASK_B };\n", "c.py": "x = 1\n"}, "c")
    (repo / "a/x.h").write_text("enum T { TASK_CHANGED_IN_WORKTREE };\n")  # never read: facts read commits
    f = Fact("e", "cpp", ["a/**", "b/*.h"], query="(enumerator name: (identifier) @key)")
    tree = Tree(str(repo), sha)
    first = extract(f, tree)
    assert first.files == ["a/x.h", "b/y.h"] and [r.key for r in first.rows] == ["TASK_A", "TASK_B"]
    again = extract(f, tree)
    assert again.rows[0] is first.rows[0]  # the same cached row object


def test_file_globs_follow_gitignore_rules(tmp_path):
    repo = shape.init_repo(tmp_path / "g")
    files = {p: "enum T { TASK_A };\n" for p in ("a.h", "src/a.h", "src/deep/b.h", "src/b.cc", "other/xa.h", "srcx/c.h")}
    sha = shape.commit(repo, files, "c")
    tree = Tree(str(repo), sha)
    def sel(*globs):
        return extract(Fact("g" + str(len(globs)) + globs[0], "cpp", list(globs), query="(enumerator name: (identifier) @key)"), tree).files
    assert sel("**/a.h") == ["a.h", "src/a.h"]
    assert sel("src") == ["src/a.h", "src/b.cc", "src/deep/b.h"]
    assert sel("src/**/*.h") == ["src/a.h", "src/deep/b.h"]
    assert sel("*.h", "!src/**") == ["a.h", "other/xa.h", "srcx/c.h"]


def test_non_utf8_and_binary_files_do_not_stop_extraction():
    f = Fact("e", "cpp", ["*"], query="(enumerator name: (identifier) @key)")
    rows, problem = extract_text(f, "x.h", b"// caf\xe9\nenum T { TASK_A };\n")
    assert [r.key for r in rows] == ["TASK_A"] and problem is None
    r = Fact("r", "regex", ["*"], regex=r"(?P<key>TASK_\w+)")
    assert [x.key for x in extract_text(r, "x.bin", b"\x00\xff\xfeTASK_B\x00")[0]] == ["TASK_B"]
    rows, problem = extract_text(f, "blob.h", bytes(range(256)) * 4)
    assert rows == [] and "syntax error" in problem


def test_files_without_a_required_literal_are_not_parsed():
    f = Fact("lit", "python", ["*.py"], query='(call function: (identifier) @_f (#eq? @_f "register_task") arguments: (argument_list (string) @key))')
    broken = b"def f(:\n    pass\n"
    assert extract_text(f, "a.py", broken) == ([], None)  # no "register_task": never parsed
    rows, problem = extract_text(f, "b.py", broken + b"x = 1\n" * 30 + b'register_task("x")\n')
    assert [r.key for r in rows] == ["x"] and problem is None  # no row's literal near the error: nothing missing
    rows, problem = extract_text(f, "b.py", b'def f(:\n    register_task("x")\n')
    assert problem is not None and problem.startswith("b.py:1")
    # A predicate on an optional capture holds when the capture is absent, so it must not filter.
    optional = Fact("opt", "python", ["*.py"], query='(argument_list (identifier)? @_f . (string) @key (#eq? @_f "nope"))')
    assert [r.key for r in extract_text(optional, "c.py", b'g("y")\n')[0]] == ["y"]


def test_facts_with_one_query_share_one_compiled_query():
    """Inferred rules repeat query texts over many facts: each text is compiled once per language."""
    from checks.facts import compile_fact

    query = "(enumerator name: (identifier) @key)"
    a = compile_fact(Fact("share_a", "cpp", ["a/*.h"], query=query))
    b = compile_fact(Fact("share_b", "cpp", ["b/*.h"], query=query))
    c = compile_fact(Fact("share_c", "c", ["b/*.h"], query=query))
    assert a.query is b.query and a.query is not None
    assert c.query is not a.query  # another grammar, another compiled query
