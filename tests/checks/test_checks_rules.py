"""Each rule kind on its own fixture: real facts over real snippets, then the kind's evaluate."""

from __future__ import annotations

import pytest

from checks.config import ConfigError, Fact, Rule, parse_config
from checks.facts import extract_text
from checks.rules import REGISTRY


def rows(fact: Fact, *files: tuple[str, str]):
    out = []
    for path, text in files:
        got, problem = extract_text(fact, path, text.encode())
        assert problem is None, problem
        out += got
    return out


def run(kind: str, facts: dict, **options):
    rule = Rule(id=f"t-{kind}", kind=kind, facts=list(facts), options=options)
    assert REGISTRY[kind].validate(rule) is None
    return REGISTRY[kind].evaluate(rule, facts)


ENUM = Fact("enum", "cpp", ["*.h"], query="(enumerator name: (identifier) @key)", options={"ignore": ["*_BEGIN", "*_END"]})
NAMES = Fact("names", "regex", ["*.cc"], regex=r'task_type_to_name\[(?P<key>\w+)\]\s*=\s*"(?P<name>\w+)"')
INCLUDES = Fact(
    "includes", "cuda", ["*.cuh"], query='(preproc_include path: (string_literal (string_content) @key))',
    options={"sub": {"key": [r"^(\w+)\.cuh$", r"TASK_\1"]}, "case": "upper"},
)


def test_registry_has_every_kind_with_docs():
    assert set(REGISTRY) == {
        "same-set", "join-equal", "arity", "pinned", "derived", "table-equal", "gate-coverage", "always-true-operand",
        "consistent",
    }
    for kind in REGISTRY.values():
        module = kind.evaluate.__module__
        assert __import__(module, fromlist=["x"]).__doc__.startswith(kind.name)


def test_same_set_reports_missing_keys_with_exceptions_and_per_file():
    enum = rows(ENUM, ("h.h", "enum T { TASK_BEGIN, TASK_A = 1, TASK_B, TASK_C, TASK_END };"))
    names = rows(NAMES, ("r.cc", 'task_type_to_name[TASK_A] = "TASK_A";\ntask_type_to_name[TASK_B] = "TASK_B";'))
    inc = rows(
        INCLUDES,
        ("sm90/task_header.cuh", '#include "a.cuh"\n#include "b.cuh"\n#include "c.cuh"\n#include "common.cuh"\n'),
        ("sm100/task_header.cuh", '#include "a.cuh"\n#include "c.cuh"\n'),
    )
    found = run("same-set", {"enum": enum, "names": names, "includes": inc}, extra_ok=["includes"], per_file=["includes"])
    msgs = sorted(f.message for f in found)
    assert len(msgs) == 2
    assert "'TASK_B'" in msgs[0] and "missing from includes (sm100/task_header.cuh)" in msgs[0]
    assert "'TASK_C'" in msgs[1] and "missing from names" in msgs[1] and "TASK_COMMON" not in " ".join(msgs)
    assert run("same-set", {"enum": enum, "names": names}, exceptions={"names": ["TASK_C"]}) == []


def test_same_set_names_a_key_as_the_source_writes_it_where_case_rewrote_it():
    kinds = Fact("kinds", "python", ["*.py"], query="(class_definition body: (block (expression_statement "
                 "(assignment left: (identifier) @key))))", options={"case": "lower"})
    table = Fact("table", "regex", ["*.cc"], regex=r'register\("(?P<key>\w+)"\)', options={"case": "lower"})
    k = rows(kinds, ("k.py", "class Kind:\n    kSizeP = 1\n    RopeQ = 2\n"))
    t = rows(table, ("t.cc", 'register("ropeq");\n'))
    assert [(r.key, r.written) for r in k] == [("ksizep", "kSizeP"), ("ropeq", "RopeQ")]
    assert t[0].written == ""  # already as compared: nothing to add
    (f,) = run("same-set", {"kinds": k, "table": t})
    assert f.message.startswith("'kSizeP' (compared as 'ksizep') is in kinds but missing from table")
    assert f.locations[0].note == "kinds has 'kSizeP'"
    assert run("same-set", {"kinds": k, "table": t})[0].fingerprint == f.fingerprint  # identity: normalised key


def test_join_equal_self_join_and_two_facts():
    returns = Fact(
        "ret", "cpp", ["*.cc"],
        query='(return_statement (call_expression function: (identifier) @_f arguments: (argument_list . (identifier) @task)) (#eq? @_f "register_task_variant"))',
        options={"key": "@function", "sub": {"key": [r"^register_(\w+)_task$", r"TASK_\1"]}, "case": {"key": "upper"}},
    )
    src = (
        "int register_a_task(int p) { return register_task_variant(TASK_A, code); }\n"
        "int register_b_task(int p) { return register_task_variant(TASK_A, code); }\n"
    )
    found = run("join-equal", {"ret": rows(returns, ("t.cc", src))}, equal=["ret.key", "ret.task"])
    assert len(found) == 1 and "'TASK_B'" in found[0].message and "ret.task = TASK_A" in found[0].message
    assert found[0].locations[0].line == 2


def test_arity_counts_branches_as_a_range():
    dispatch = Fact("dispatch", "regex", ["*.cc"], regex=r'make_tuple\((?P<num_inputs>\d+), (?P<num_outputs>\d+), (?P<key>\w+)\)')
    wrapper = Fact(
        "wrapper", "python", ["*.py"],
        query='(call function: (attribute attribute: (identifier) @_n) (#eq? @_n "new_input")) @input\n'
              '(call function: (attribute attribute: (identifier) @_r) arguments: (argument_list . (_) . (string (string_content) @key)) (#eq? @_r "register_task"))',
        options={"count": "input", "sub": {"key": ["^(.*)$", r"TASK_\1"]}, "case": {"key": "upper"}},
    )
    py = '''
def a_layer(g, x, y, r=None):
    g.new_input(x)
    if r is not None:
        g.new_input(r)
    for t in y:
        g.new_input(t)
    g.register_task(g, "a", [])

def b_layer(g, x):
    g.new_input(x)
    g.register_task(g, "b", [])
'''
    w = rows(wrapper, ("w.py", py))
    assert {r.key: str(r.values["count"]) for r in w} == {"TASK_A": "1..3", "TASK_B": "1"}
    cc = "make_tuple(2, 1, TASK_A)\nmake_tuple(4, 1, TASK_A2)\nmake_tuple(2, 1, TASK_B)\n"
    found = run("arity", {"dispatch": rows(dispatch, ("g.cc", cc)), "wrapper": w}, count="wrapper.count", declared=["dispatch.num_inputs"])
    assert len(found) == 1 and "'TASK_B'" in found[0].message and "dispatch.num_inputs = 2" in found[0].message


def test_pinned_value_and_missing_key():
    flags = Fact("flags", "python", ["*.py"], query="(module (expression_statement (assignment left: (identifier) @key right: (_) @value)))")
    r = rows(flags, ("c.py", "use_mtp = True\nblock = 128\n"))
    assert run("pinned", {"flags": r}, values={"use_mtp": True, "block": 128}) == []
    found = run("pinned", {"flags": r}, values={"use_mtp": False, "gone": "1"})
    assert sorted(f.message for f in found) == ["'gone' is pinned to 1 but no longer found", "'use_mtp' is True, pinned to False"]


def test_derived_resolves_constants_across_files_and_languages():
    cpp = Fact("cpp", "cpp", ["*.h"], query="(declaration (type_qualifier) declarator: (init_declarator declarator: (identifier) @key value: (_) @value))")
    py = Fact("py", "regex", ["*.py"], regex=r"^(?P<key>[A-Z_]+)\s*=\s*(?P<value>.+)$")
    h = "constexpr int ROPE = 64u;\nconstexpr int NOPE = RANK - ROPE;\nconstexpr int SCALE = NOPE / 56;\n"
    facts = {"cpp": rows(cpp, ("m.h", h)), "py": rows(py, ("c.py", "RANK = 512\n"))}
    assert run("derived", facts, expr="NOPE + ROPE * 2 + SCALE == 584") == []
    found = run("derived", facts, expr="NOPE + ROPE * 2 + SCALE == 600")
    assert len(found) == 1 and "584 == 600" in found[0].message
    missing = run("derived", facts, expr="NOPE == MISSING")
    assert "'MISSING' is not defined" in missing[0].message


def test_constants_and_gates_nested_past_pythons_depth_are_findings_not_crashes():
    """A head can write a constant or a gate deeper than ast.parse (or the evaluator) recurses."""
    deep = "+".join(["1"] * 5000)
    py = Fact("py", "regex", ["*.py"], regex=r"^(?P<key>[A-Z_0-9]+)\s*=\s*(?P<value>.+)$")
    chain = "".join(f"C{i} = C{i + 1} + 1\n" for i in range(3000)) + "C3000 = 1\n"
    facts = {"py": rows(py, ("c.py", f"RANK = {deep}\nROPE = 64\n" + chain))}
    found = run("derived", facts, expr="RANK == ROPE")
    # Python 3.11's parser refuses 5000 nested operators; 3.12's parses them and the evaluator stops instead
    assert len(found) == 1 and len(found[0].message) < 400, found
    assert "cannot read expression" in found[0].message or "'RANK' is nested too deeply" in found[0].message
    found = run("derived", facts, expr="C0 == 3001")  # 3000 names deep: past the recursion limit
    assert len(found) == 1 and "nested too deeply" in found[0].message
    gate = Fact("g", "python", ["*.py"], query="(if_statement condition: (_) @key)")
    g = rows(gate, ("s.py", f"if x < {deep}:\n    pass\n"))
    found = run("gate-coverage", {"g": g}, range=[1, 8])
    # 3.11 cannot parse it; 3.12.3 parses it, and the sum is not a number: either way a short finding
    said = ("cannot read condition", "must compare one variable with a number")
    assert any(any(s in f.message for s in said) for f in found) and all(len(f.message) < 400 for f in found), found
    long_gate = rows(gate, ("s.py", "if x < y + " + "+".join(["1"] * 300) + ":\n    pass\n"))
    found = run("gate-coverage", {"g": long_gate}, range=[1, 8])
    assert found and all(len(f.message) < 400 for f in found), found  # parsed, refused, and quoted clipped


def test_table_equal_reports_each_differing_key():
    table = "(assignment left: (identifier) @_n right: (dictionary (pair key: (string (string_content) @key) value: (_) @value)) (#eq? @_n \"RULES\"))"
    a = Fact("a", "python", ["a.py"], query=table)
    b = Fact("b", "python", ["b.py"], query=table)
    ra = rows(a, ("a.py", "RULES = {'wq': ('col', 0), 'wo': ('row', 1), 'w1': ('col', 0)}"))
    rb = rows(b, ("b.py", 'RULES = {"wq": ("col",0), "wo": ("col", 1), "w3": ("col", 0)}'))
    found = run("table-equal", {"a": ra, "b": rb})
    assert sorted(f.message.split(" ")[0] for f in found) == ["'w1'", "'w3'", "'wo'"]
    index = Fact("l", "python", ["l.py"], query="(assignment right: (list (_) @value))", options={"key": "@index"})
    la = rows(index, ("l.py", "X = [1, 2, 3]"))
    lb = rows(Fact("m", "python", ["m.py"], query="(assignment right: (list (_) @value))", options={"key": "@index"}), ("m.py", "Y = [1, 5, 3]"))
    found = run("table-equal", {"l": la, "m": lb})
    assert [f.message.split(" ")[0] for f in found] == ["'1'"]


def test_gate_coverage_gap_and_overlap():
    gate = Fact("g", "cuda", ["*.cuh"], query="(if_statement condition: (condition_clause value: (_) @key) consequence: (return_statement))")
    py = Fact("p", "python", ["*.py"], query="(if_statement condition: (_) @key)")
    decode = rows(gate, ("d.cuh", "void d() { if (Q_LEN > 8) return; }"))
    prefill = rows(Fact("g2", "cuda", ["*.cuh"], query=gate.query), ("p.cuh", "void p() { if (Q_LEN < 16) return; }"))
    found = run("gate-coverage", {"g": decode, "g2": prefill}, range=[1, 64], reject=["g", "g2"])
    assert [f.message for f in found] == ["values 9–15 of [1, 64] are handled by no gate"]
    mid = rows(py, ("s.py", "if mbt >= 9 and mbt < 32:\n    pass\n"))
    found = run("gate-coverage", {"g": decode, "g2": prefill, "p": mid}, range=[1, 64], reject=["g", "g2"])
    assert len(found) == 1 and found[0].message.startswith("values 16–31 are handled by more than one gate")
    assert run("gate-coverage", {"g": decode, "g2": prefill, "p": mid}, range=[1, 64], reject=["g", "g2"], allow_overlap=True) == []


def test_always_true_operand_in_cpp_and_python():
    cpp = Fact("c", "cpp", ["*.cc"], query="(condition_clause value: (binary_expression) @key)")
    src = "void f() { if (t == A || t == B || (C)) {} if (t == A || ready()) {} if (x && y) {} if (t == A || verbose) {} }"
    found = run("always-true-operand", {"c": rows(cpp, ("r.cc", src))})
    assert len(found) == 1 and "'C' is a bare operand" in found[0].message and "write t == C" in found[0].message
    py = Fact("p", "python", ["*.py"], query="(if_statement condition: (_) @key)")
    found = run("always-true-operand", {"p": rows(py, ("r.py", "if kind == A or Kind.B:\n    pass\nif kind == A or 3:\n    pass\n"))})
    assert [f.message.split(" is a bare")[0] for f in found] == ["'Kind.B'", "'3'"]
    assert "write kind == Kind.B" in found[0].message
    anything = run("always-true-operand", {"c": rows(cpp, ("r.cc", src))}, bare="any")
    assert sorted(f.message.split(" is a bare")[0] for f in anything) == ["'C'", "'verbose'"]


FACTS = '''
[[fact]]
id = "a"
lang = "cpp"
files = ["*.h"]
query = "(identifier) @key"

[[fact]]
id = "b"
lang = "cpp"
files = ["*.h"]
query = "(identifier) @key"
'''


@pytest.mark.parametrize(
    "rule, needle",
    [
        ('kind = "same-set"\nfacts = ["a"]', "relates at least 2 facts"),
        ('kind = "same-set"\nfacts = ["a", "b"]\nextra_ok = ["c"]', "key 'extra_ok': 'c' is not one of this rule's facts"),
        ('kind = "same-sett"\nfacts = ["a", "b"]', "did you mean 'same-set'"),
        ('kind = "join-equal"\nfacts = ["a", "b"]', "needs option 'equal'"),
        ('kind = "join-equal"\nfacts = ["a", "b"]\nequal = ["a.key", "z.key"]', "names fact 'z'"),
        ('kind = "arity"\nfacts = ["a", "b"]\ncount = "a"\ndeclared = ["b.n"]', "'a' is not FACT.FIELD"),
        ('kind = "join-equal"\nfacts = ["a", "b"]\nequal = ["a.key + b.key", "b.key"]', "mixes facts a, b"),
        ('kind = "join-equal"\nfacts = ["a", "b"]\nequal = ["a.key / 2", "b.key"]', "only + - * //"),
        ('kind = "consistent"\nfacts = ["a"]\nfeild = "x"', "unknown option 'feild'"),
        ('kind = "gate-coverage"\nfacts = ["a"]\nrange = [1, 4]\nconstants = ["z"]', "'z' is not one of this rule's facts"),
        ('kind = "pinned"\nfacts = ["a"]', "exactly one of 'value' or 'values'"),
        ('kind = "derived"\nfacts = ["a"]\nexpr = "A == = B"', "cannot read expression"),
        ('kind = "table-equal"\nfacts = ["a"]', "exactly 2 facts"),
        ('kind = "gate-coverage"\nfacts = ["a"]\nrange = [5, 1]', "'range' must be [lo, hi]"),
        ('kind = "always-true-operand"\nfacts = ["a"]\nfeild = "x"', "unknown option 'feild'"),
    ],
)
def test_bad_rule_options_name_file_line_key_and_fix(rule, needle):
    text = FACTS + '\n[[rule]]\nid = "r"\n' + rule + "\n"
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "cfg.toml")
    message = str(exc.value)
    assert needle in message and message.startswith("cfg.toml:1") and "[[rule]] #1" in message


# The config this repo proposes for itself: every rule kind has a section in docs/rules.md.
KIND_NAMES = Fact(
    "rule_kind_names", "python", ["checks/rules/*.py"],
    query='(call function: (identifier) @_k arguments: (argument_list . (string (string_content) @key)) (#eq? @_k "RuleKind"))',
)
DOC_SECTIONS = Fact("rule_kind_docs", "regex", ["docs/rules.md"], regex=r"^## (?P<key>[a-z]+(?:-[a-z]+)*)$")


def test_every_rule_kind_is_documented():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = rows(KIND_NAMES, *[(str(p.relative_to(root)), p.read_text()) for p in sorted((root / "checks/rules").glob("*.py"))])
    docs = rows(DOC_SECTIONS, ("docs/rules.md", (root / "docs/rules.md").read_text()))
    assert sorted(r.key for r in code) == sorted(REGISTRY)
    assert run("same-set", {"rule_kind_names": code, "rule_kind_docs": docs}) == []
    missing = run("same-set", {"rule_kind_names": code, "rule_kind_docs": docs[1:]})
    assert len(missing) == 1 and f"'{docs[0].key}'" in missing[0].message


def test_the_documented_self_config_is_valid():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs/rules.md").read_text()
    block = re.findall(r"```toml\n(.*?)```", text.split("## Example: the rules this repository runs on itself")[1], re.S)[0]
    config = parse_config(block, "docs/rules.md")
    assert {r.kind for r in config.rules} == {"same-set", "pinned"} and len(config.facts) == 5


def test_docs_sections_name_every_option_of_their_kind_and_of_facts():
    """docs/rules.md stays in step with the rule modules: each kind's section names each of its options."""
    import importlib
    import re
    from pathlib import Path

    from checks.facts import OPTIONS as FACT_OPTIONS

    text = (Path(__file__).resolve().parents[2] / "docs/rules.md").read_text()
    sections = dict(re.findall(r"^## ([a-z-]+|Facts)\n(.*?)(?=^## |\Z)", text, re.S | re.M))
    for name, kind in REGISTRY.items():
        options = importlib.import_module(kind.evaluate.__module__).OPTIONS
        missing = [o for o in options if not re.search(rf"\b{o}\b", sections.get(name, ""))]
        assert not missing, f"docs/rules.md section '{name}' does not mention {missing}"
    missing = [o for o in FACT_OPTIONS if not re.search(rf"\b{o}\b", sections["Facts"])]
    assert not missing, f"docs/rules.md section 'Facts' does not mention {missing}"


@pytest.mark.parametrize("calls", ["ops.scale(1, 2)\nops.scale(1, 2, 3)\n", "ops.scale(1, 2, 3)\nops.scale(1, 2)\n"])
def test_every_call_is_compared_whichever_order_the_calls_are_in(calls):
    cpp = Fact("cpp", "cpp", ["*.cc"], options={"len": ["n"]},
               query="(function_definition declarator: (function_declarator declarator: (identifier) @key parameters: (parameter_list) @n))")
    py = Fact("py", "python", ["*.py"], options={"len": ["n"]},
              query="(call function: (attribute attribute: (identifier) @key) arguments: (argument_list) @n)")
    facts = {"cpp": rows(cpp, ("ops.cc", "int scale(int a, int b) { return a * b; }\n")), "py": rows(py, ("use.py", calls))}
    for equal in (["cpp.n", "py.n"], ["py.n", "cpp.n"]):  # nor the order of the operands
        found = run("join-equal", facts, equal=equal)
        three = calls.splitlines().index("ops.scale(1, 2, 3)") + 1
        assert len(found) == 1 and f"use.py:{three}" in found[0].message, [f.message for f in found]
        assert {(loc.path, loc.line) for loc in found[0].locations} == {("ops.cc", 1), ("use.py", three)}
