"""Inferred invariants end to end on real git repos: zero config catches a registry drifting across files,
clean changes give nothing, findings use the engine's states and fingerprints, declared rules win."""

from __future__ import annotations

import pytest

from checks.audit import run_checks
from checks.config import default_config, parse_config
from checks.diff import build_changeset
from checks.infer import infer
from checks.model import AuditRequest
from checks.workspace import Tree, checkout
from tests.gitrepo import GitRepo
from tests.infer import engine


def audit(repo, base, head, config=None):
    co = checkout(AuditRequest(repo=str(repo), base=base, head=head))
    return run_checks(co, config or default_config(), build_changeset(co))


@pytest.fixture
def repo(tmp_path):
    r = GitRepo(tmp_path / "engine")
    base = r.commit_files(engine.files(), "Engine with five ops")
    return r, base


def test_registry_drift_across_files_is_caught_with_zero_config(repo):
    r, base = repo
    head = r.commit_files(engine.files(engine.OPS + ["rope"], registry=engine.OPS), "Add rope")
    found = audit(r.path, base, head)
    new = found.with_status("new")
    assert len(new) == 1, [f.message for f in found.findings]
    f = new[0]
    assert f.source == "inferred" and f.rule.startswith("inferred-")
    # The names as the source writes them, each side by what it is and where, and the fix.
    assert f.message.startswith("`OP_ROPE` is in enum OpKind (csrc/ops.h:8) and array OP_NAMES (csrc/ops.cpp:8, "
                                'as "rope") but missing from dict keys of KERNELS (engine/registry.py:4-8).')
    assert "same 6 names" in f.message and 'there `OP_ADD` is written "add"' in f.message
    assert f'add "{f.rule}" to [settings] disable' in f.message and "@" not in f.message
    assert [loc.note for loc in f.locations] == ["enum OpKind lists `OP_ROPE` here", 'array OP_NAMES lists "rope" here']
    assert f.evidence[0].startswith("support 6:") and any("engine/registry.py:" in e for e in f.evidence)
    assert {loc.path for loc in f.locations} == {"csrc/ops.h", "csrc/ops.cpp"}
    assert f.fingerprint and f.state
    assert f.rule in found.rules_run
    assert found.inferred and found.inferred[0].startswith(f.rule)
    assert "hold the same names (6 names, 3 files)" in found.inferred[0]


def test_a_clean_change_gives_zero_findings(repo):
    r, base = repo
    head = r.commit_files(engine.files(engine.OPS + ["rope"]), "Add rope everywhere")
    found = audit(r.path, base, head)
    assert [f.message for f in found.findings] == []
    assert found.rules_run and found.inferred  # the invariant was checked, and held


def test_a_drift_already_on_the_base_is_pre_existing_then_fixed(repo):
    r, base = repo
    drift = r.commit_files(engine.files(engine.OPS + ["rope"], registry=engine.OPS), "Add rope")
    later = r.commit_files({"README.md": "engine, now with rope\n"}, "Docs")
    # Inference reads the base: on a drifted base the relation does not hold, so it is not a rule.
    assert audit(r.path, drift, later).findings == []
    fixed = r.commit_files(engine.files(engine.OPS + ["rope"]), "Register rope")
    found = audit(r.path, base, fixed)
    assert found.findings == []
    # The same drift, audited twice from one base: identical fingerprints, so a re-run is stable.
    again = audit(r.path, base, drift)
    first = audit(r.path, base, drift)
    assert [f.fingerprint for f in again.findings] == [f.fingerprint for f in first.findings]


def test_inference_off_runs_no_inferred_rule(repo):
    r, base = repo
    head = r.commit_files(engine.files(engine.OPS + ["rope"], registry=engine.OPS), "Add rope")
    found = audit(r.path, base, head, parse_config("[settings]\ninfer = false\ncochange = false\n"))
    assert found.findings == [] and found.rules_run == [] and found.inferred == []


def test_an_empty_repo_says_no_rule_ran(tmp_path):
    r = GitRepo(tmp_path / "plain")
    base = r.commit_files({"a.py": "x = 1\n"}, "one")
    head = r.commit_files({"a.py": "x = 2\n"}, "two")
    found = audit(r.path, base, head)
    assert found.rules_run == [] and found.inferred == [] and found.findings == []


DECLARED = """
[[fact]]
id = "ops"
lang = "cpp"
files = ["csrc/ops.h"]
query = "(enumerator name: (identifier) @key)"
sub = { key = ["^OP_", ""] }
case = "lower"
ignore = ["count"]

[[fact]]
id = "registry"
lang = "python"
files = ["engine/registry.py"]
query = "(pair key: (string) @key)"

[[rule]]
id = "ops-registered"
kind = "same-set"
facts = ["ops", "registry"]

[settings]
infer = true
cochange = false
"""


def test_a_declared_rule_wins_over_the_inferred_one_on_the_same_facts(repo):
    r, base = repo
    head = r.commit_files(engine.files(engine.OPS + ["rope"], registry=engine.OPS), "Add rope")
    found = audit(r.path, base, head, parse_config(DECLARED))
    assert [(f.rule, f.source) for f in found.findings] == [("ops-registered", "declared")]
    # The inferred rule over the enum and the dict is gone; one over other facts (the name table's order) stays.
    assert not any("engine/registry.py" in line for line in found.inferred), found.inferred
    assert any("csrc/ops.cpp" in line for line in found.inferred)


def test_inferred_and_declared_combine_on_other_facts(repo):
    r, base = repo
    # Only the C++ name table drifts: the declared rule (enum vs dict) holds, the inferred one (all three) does not.
    head = r.commit_files(engine.files(engine.OPS + ["rope"], names=engine.OPS), "Add rope")
    text = DECLARED.replace('files = ["engine/registry.py"]', 'files = ["engine/kernels.py"]').replace(
        '"(pair key: (string) @key)"', '"(function_definition name: (identifier) @key)"')
    found = audit(r.path, base, head, parse_config(text))
    new = found.with_status("new")
    assert new and {f.source for f in new} == {"inferred"}, [f.message for f in found.findings]
    assert any("`OP_ROPE`" in f.message and "missing from array OP_NAMES (csrc/ops.cpp:3-7)" in f.message for f in new)
    assert "ops-registered" in found.rules_run and all(f.rule in found.rules_run for f in new)


def test_warm_inference_comes_from_the_cache_and_matches(repo, tmp_path):
    r, base = repo
    tree = Tree(str(r.path), base)
    cold = infer(tree, cache_dir=tmp_path / "c")
    warm = infer(tree, cache_dir=tmp_path / "c")
    assert not cold.cached and warm.cached
    assert [x.id for x in warm.rules] == [x.id for x in cold.rules] and cold.rules
    assert warm.rules[0].evidence == cold.rules[0].evidence and warm.rules[0].source == "inferred"


def test_a_result_cached_by_other_inference_code_is_mined_again(repo, tmp_path, monkeypatch):
    # An upgrade that changes how rules are mined must not be served the old rules from the user's cache.
    import checks.infer as inference

    r, base = repo
    tree = Tree(str(r.path), base)
    assert not infer(tree, cache_dir=tmp_path / "c").cached and infer(tree, cache_dir=tmp_path / "c").cached
    monkeypatch.setattr(inference, "code_digest", lambda: "another version")
    again = infer(tree, cache_dir=tmp_path / "c")
    assert not again.cached and again.rules


def test_python_registrations_spread_over_files_are_one_family(tmp_path):
    r = GitRepo(tmp_path / "models")
    models = ["llama", "qwen", "mistral", "gemma"]
    files = {f"models/{m}.py": f'from reg import register_model\n\n\n@register_model("{m}")\nclass M:\n    pass\n'
             for m in models}
    files["config.py"] = "SUPPORTED = [" + ", ".join(f'"{m}"' for m in models) + "]\n"
    base = r.commit_files(files, "four models")
    head = r.commit_files({"models/phi.py": files["models/llama.py"].replace("llama", "phi")}, "phi")
    found = audit(r.path, base, head)
    assert [f.source for f in found.findings] == ["inferred"]
    assert found.findings[0].message.startswith(
        '"phi" is in registrations via register_model (models/phi.py:4) but missing from list SUPPORTED (config.py:1)')


def _switch(fn: str, labels: list[str]) -> str:
    cases = "".join(f"        case {x}: return {i};\n" for i, x in enumerate(labels))
    return f"int {fn}(int v) {{\n    switch (v) {{\n{cases}        default: return -1;\n    }}\n}}\n"


def test_a_switch_over_two_enums_is_checked_per_enum(tmp_path):
    r = GitRepo(tmp_path / "backend")
    ops = ["OP_ADD", "OP_MUL", "OP_SILU", "OP_GELU", "OP_ROPE"]
    types = ["TYPE_F32", "TYPE_F16", "TYPE_BF16", "TYPE_Q8"]
    header = "enum op_kind {\n" + "".join(f"    {o},\n" for o in ops) + "};\n"
    header += "enum dtype {\n" + "".join(f"    {t},\n" for t in types) + "};\n"
    files = {"include/ops.h": header, "src/supports.cpp": _switch("supports", ops + types[:2])}
    base = r.commit_files(files, "backend supports every op")
    head = r.commit_files({"include/ops.h": header.replace("    OP_ROPE,\n", "    OP_ROPE,\n    OP_TOPK,\n")}, "add topk")
    found = audit(r.path, base, head)
    assert len(found.findings) == 1, [f.message for f in found.findings]
    msg = found.findings[0].message
    assert msg.startswith("`OP_TOPK` is in enum op_kind (include/ops.h:7) but missing from case labels OP_* in supports "
                          "(src/supports.cpp:3-7)"), msg


def test_definitions_and_the_table_listing_them_agree_in_one_file(tmp_path):
    r = GitRepo(tmp_path / "patches")
    models = ["llama", "qwen2", "gemma", "mistral"]
    defs = "".join(f"def apply_patch_to_{m}():\n    pass\n\n\n" for m in models)
    table = "MODEL_TO_PATCH = {\n" + "".join(f'    "{m}": apply_patch_to_{m},\n' for m in models) + "}\n"
    base = r.commit_files({"pkg/patch.py": defs + table}, "four patched models")
    head = r.commit_files({"pkg/patch.py": defs + "def apply_patch_to_phi3():\n    pass\n\n\n" + table}, "phi3, unlisted")
    found = audit(r.path, base, head)
    assert len(found.findings) == 1, [f.message for f in found.findings]
    assert found.findings[0].message.startswith(
        "`apply_patch_to_phi3` is in functions apply_patch_to_* (pkg/patch.py:17) but missing from dict values of "
        "MODEL_TO_PATCH (pkg/patch.py:")


def test_an_enum_and_the_table_it_indexes_keep_one_order(tmp_path):
    r = GitRepo(tmp_path / "names")
    ops = ["ABS", "SGN", "NEG", "STEP", "TANH", "ELU", "RELU"]

    def tree(enum_ops, names):
        h = "enum unary_op {\n" + "".join(f"    UNARY_OP_{o},\n" for o in enum_ops) + "    UNARY_OP_COUNT,\n};\n"
        c = "static const char * UNARY_OP_NAME[UNARY_OP_COUNT] = {\n" + "".join(f'    "{o}",\n' for o in names) + "};\n"
        return {"include/ops.h": h, "src/names.c": c}

    base = r.commit_files(tree(ops, ops), "unary ops")
    grown = r.commit_files(tree(ops + ["GELU"], ops + ["GELU"]), "gelu, in both, in order")
    assert audit(r.path, base, grown).findings == []
    swapped = ops[:5] + ["RELU", "ELU"]
    head = r.commit_files(tree(swapped + ["GELU"], ops + ["GELU"]), "enum reordered, table not")
    found = audit(r.path, grown, head)
    assert len(found.findings) == 2 and all("in the same order" in f.message for f in found.findings), [
        f.message for f in found.findings]
    assert any("the 6th name (bound markers such as COUNT not counted) is `UNARY_OP_RELU` at include/ops.h:7 and \"ELU\" "
               "at src/names.c:7" in f.message
               for f in found.findings), [f.message for f in found.findings]
    assert {f.rule for f in found.findings} == {found.findings[0].rule}  # one order rule, one finding per position


def _layers(inputs: dict[str, int]) -> str:
    body = "class Kernel:\n"
    for name, n in inputs.items():
        calls = "".join(f"        g.new_input(x{i})\n" for i in range(n))
        body += f"    def {name}_layer(self, g, *x):\n{calls}        g.new_output(x[0])\n\n"
    return body


def _registers(inputs: dict[str, int]) -> str:
    return "".join(f"int register_{name}_task() {{\n  int num_inputs = {n};\n  return 0;\n}}\n\n"
                   for name, n in inputs.items())


def test_call_counts_agree_with_the_numbers_declared_elsewhere(tmp_path):
    r = GitRepo(tmp_path / "counts")
    ops = {"embedding": 2, "rmsnorm": 2, "linear": 3, "attention": 4, "allreduce": 1}
    base = r.commit_files({"py/kernel.py": _layers(ops), "src/register.cc": _registers(ops)}, "five tasks")
    both = {**ops, "linear": 4}
    clean = r.commit_files({"py/kernel.py": _layers(both), "src/register.cc": _registers(both)}, "linear takes a bias")
    assert audit(r.path, base, clean).findings == []
    head = r.commit_files({"py/kernel.py": _layers({**both, "rmsnorm": 3})}, "rmsnorm gains an input, C++ not told")
    found = audit(r.path, clean, head)
    assert len(found.findings) == 1, [f.message for f in found.findings]
    f = found.findings[0]
    assert f.source == "inferred" and f.evidence[0].startswith("support 5")
    assert f.message.startswith("`rmsnorm_layer` calls .new_input() 3 time(s) (py/kernel.py:"), f.message
    assert "but `register_rmsnorm_task` declares num_inputs = 2 (src/register.cc:" in f.message


def test_an_inferred_rule_is_silenced_by_the_id_its_finding_shows(repo):
    r, base = repo
    head = r.commit_files(engine.files(engine.OPS + ["rope"], registry=engine.OPS), "Add rope")
    [finding] = audit(r.path, base, head).with_status("new")
    config = parse_config(f'[settings]\ndisable = ["{finding.rule}", "co-change"]\n')
    quiet = audit(r.path, base, head, config)
    assert finding.rule not in quiet.rules_run and not quiet.with_status("new")
    assert all(f.rule != "co-change" for f in quiet.findings)
    assert quiet.rules_run  # the other inferred invariants still run


def test_disabling_an_unknown_declared_rule_is_still_a_config_error():
    from checks.config import ConfigError

    with pytest.raises(ConfigError, match="disable: no rule 'nosuch'"):
        parse_config('[settings]\ndisable = ["nosuch"]\n')


def test_an_order_rule_reads_a_name_like_a_bound_marker_alike_in_the_enum_and_the_string_table(tmp_path):
    # SOFT_MAX ends like a bound marker (*_MAX): both sides must leave it out, quoted or not, or the rule never holds.
    r = GitRepo(tmp_path / "ops")
    ops = ["NONE", "ADD", "SOFT_MAX", "TANH", "ELU", "RELU", "ROPE"]

    def tree(enum_ops):
        h = "enum ggml_op {\n" + "".join(f"    GGML_OP_{o},\n" for o in enum_ops) + "    GGML_OP_COUNT,\n};\n"
        c = "static const char * GGML_OP_NAME[GGML_OP_COUNT] = {\n" + "".join(f'    "{o}",\n' for o in ops) + "};\n"
        return {"include/ggml.h": h, "src/ggml.c": c}

    base = r.commit_files(tree(ops), "ops")
    head = r.commit_files(tree(["NONE", "ADD", "SOFT_MAX", "ELU", "TANH", "RELU", "ROPE"]), "TANH moved in the enum only")
    found = audit(r.path, base, head)
    assert found.findings and all("in the same order" in f.message for f in found.findings), [
        f.message for f in found.findings]
    assert any("`GGML_OP_ELU` at include/ggml.h:5 and \"TANH\" at src/ggml.c:5" in f.message for f in found.findings)


def test_names_missing_together_say_so_in_each_finding(repo):
    r, base = repo
    head = r.commit_files(engine.files(engine.OPS + ["rope", "topk"], registry=engine.OPS), "Add rope and topk")
    new = audit(r.path, base, head).with_status("new")
    assert len(new) == 2, [f.message for f in new]
    assert all(f.message.endswith("One of 2 names missing from dict keys of KERNELS together: `OP_ROPE`, `OP_TOPK`.")
               for f in new), [f.message for f in new]


def test_benchmark_scripts_copying_a_table_header_are_no_rule(tmp_path):
    # Benchmarks, like tests and examples, copy tables on purpose: one script gaining a column is no drift.
    r = GitRepo(tmp_path / "bench")
    cols = ["name", "shape", "time_us", "gbps", "speedup"]
    files = {f"benchmarks/bench_{k}.py": f"headers = {cols!r}\n" for k in ("a", "b", "c")}
    base = r.commit_files(files, "three benchmarks")
    head = r.commit_files({"benchmarks/bench_a.py": f"headers = {cols + ['pct_peak_bw']!r}\n"}, "a new column")
    assert audit(r.path, base, head).findings == []
    from checks.infer.families import source_files

    assert source_files(Tree(str(r.path), head)) == []


def _predicate(fn: str, labels: list[str], test: str = "true") -> str:
    cases = "".join(f"        case {x}:\n" for x in labels)
    return f"bool {fn}(int t) {{\n    switch (t) {{\n{cases}            return {test};\n        default:\n" \
           f"            return false;\n    }}\n}}\n"


def test_two_feature_predicates_agreeing_is_no_rule_but_a_predicate_and_its_dispatch_is(tmp_path):
    # supports_reorder_dmmv and supports_reorder_mmvq listing the same 8 types is history; supports_op listing the
    # ops compute_forward dispatches is design.
    types = [f"TYPE_Q{i}" for i in range(8)]
    ops = [f"OP_{i}" for i in range(8)]
    r = GitRepo(tmp_path / "backend")
    files = {"src/reorder.cpp": _predicate("supports_reorder_dmmv", types)
             + _predicate("supports_reorder_mmvq", types, "!prefer_dmmv && t != 0"),
             "src/backend.cpp": _predicate("supports_op", ops) + _switch("compute_forward", ops)}
    base = r.commit_files(files, "two reorder paths, one backend")
    head = r.commit_files({"src/reorder.cpp": files["src/reorder.cpp"].replace("        case TYPE_Q7:\n", "", 1),
                           "src/backend.cpp": files["src/backend.cpp"].replace("        case OP_7:\n", "", 1)},
                          "Q7 dropped from dmmv reorder, OP_7 from supports_op")
    new = audit(r.path, base, head).with_status("new")
    assert [f.message.split(" is in ")[0] for f in new] == ["`OP_7`"], [f.message for f in new]
    assert "compute_forward" in new[0].message and "supports_op" in new[0].message


def test_a_pr_deleting_a_file_of_an_invariant_says_it_was_not_checked(repo):
    r, base = repo
    r.rm("csrc/ops.cpp")
    head = r.commit("Drop the C++ name table")
    found = audit(r.path, base, head)
    assert found.findings == [] and found.unchecked == []
    gone = [line for line in found.inferred if "not checked" in line]
    assert gone and all(line.split(": ", 1)[1].startswith("not checked (this PR deletes csrc/ops.cpp, which held one "
                                                          "of its lists): ") for line in gone), gone
    # The rules not holding that file still ran and say nothing about it.
    assert all("not checked" not in line for line in found.inferred if line.split(":")[0] in found.rules_run)


def test_two_copies_of_an_enum_or_of_a_list_keep_their_names_but_no_order(tmp_path):
    # A host and a device copy of one enum, and two conf.py lists: the names are kept in step (same-set), but
    # neither indexes the other, so reordering one is no drift and there is no order rule to break.
    r = GitRepo(tmp_path / "copies")
    kinds = ["Normal", "MGrouped", "KGrouped", "Batched", "Masked"]

    def enum(names):
        return "enum class GemmType {\n" + "".join(f"    {n},\n" for n in names) + "};\n"

    def conf(names):
        return f"extensions = {[f'sphinx.ext.{n.lower()}doc' for n in names]!r}\n"

    files = {"include/types.hpp": enum(kinds), "include/types.cuh": enum(kinds),
             "docs/en/conf.py": conf(kinds), "docs/cn/conf.py": conf(kinds)}
    base = r.commit_files(files, "two enums, two lists")
    out = infer(Tree(str(r.path), base))
    assert len(out.rules) == 2 and all("hold the same names" in line for line in out.lines), out.lines
    assert [x.kind for x in out.rules] == ["same-set", "same-set"]
    swapped = kinds[:3] + ["Masked", "Batched"]
    head = r.commit_files({"include/types.cuh": enum(swapped), "docs/cn/conf.py": conf(swapped)}, "reordered")
    assert audit(r.path, base, head).findings == []


def test_a_missing_name_finding_says_the_fix_within_the_first_400_characters(tmp_path):
    # The comment clips a finding's message at 400 characters: long real paths must not push the fix out.
    r = GitRepo(tmp_path / "deep")
    keys = ["weight_dir", "load_way", "mode", "tp_rank", "world_size", "weight_dict"]
    a = "lightllm/server/router/model_infer/mode_backend/base_backend.py"
    b = "lightllm/server/router/model_infer/mode_backend/continues_batch/impl_mtp.py"

    def kv(name, ks, src):
        return f"def init(self):\n    {name} = {{\n" + "".join(f'        "{k}": {src}.{k},\n' for k in ks) + "    }\n"

    base = r.commit_files({a: kv("model_kvargs", keys, "self"), b: kv("mtp_model_kvargs", keys, "args")}, "kvargs")
    head = r.commit_files({a: kv("model_kvargs", ["kv_cache_dtype"] + keys, "self")}, "a new kwarg on one side")
    (f,) = audit(r.path, base, head).with_status("new")
    assert f.message.startswith('"kv_cache_dtype" is in dict keys of model_kvargs')
    assert "Fix: add it to dict keys of mtp_model_kvargs, or remove it from the other." in f.message[:400], f.message
    assert "written as here" not in f.message and "same 6 names" in f.message


def test_the_evidence_of_one_list_inside_another_says_so(tmp_path):
    r = GitRepo(tmp_path / "sub")
    names = ["weight_dir", "load_way", "mode", "tp_rank", "world_size"]

    def table(var, ks):
        return f"{var} = {{\n" + "".join(f'    "{k}": {i},\n' for i, k in enumerate(ks)) + "}\n"

    base = r.commit_files({"engine/base.py": table("model_kvargs", names),
                           "engine/mtp.py": table("mtp_kvargs", names + ["spec_algo", "draft_dir"])}, "kvargs")
    out = infer(Tree(str(r.path), base))
    (rule,) = [x for x in out.rules if x.kind == "same-set"]
    assert rule.evidence[0] == ("support 5: every one of the 5 names of dict keys of model_kvargs (engine/base.py) "
                                "is also in dict keys of mtp_kvargs (engine/mtp.py)"), rule.evidence


def test_two_copies_of_one_enum_the_fix_names_the_file_to_change(tmp_path):
    r = GitRepo(tmp_path / "kernels")
    roles = "Empty = 0, Load = 1, Mma = 2, Compute = 3, Reduce = 4"

    def kernel(body):
        return f"struct Kernel {{\n  enum class WarpRole {{\n    {body}\n  }};\n}};\n"

    base = r.commit_files({"csrc/bwd.hpp": kernel(roles), "csrc/bwd_mla.hpp": kernel(roles)}, "two kernels")
    head = r.commit_files({"csrc/bwd.hpp": kernel(roles + ", Prefetch = 5")}, "a prefetch role")
    (f,) = audit(r.path, base, head).with_status("new")
    assert "Fix: add it to enum WarpRole in csrc/bwd_mla.hpp, or remove it from the other." in f.message, f.message


def test_findings_say_which_base_inference_read_and_nothing_when_it_is_off(repo, tmp_path):
    r, base = repo
    head = r.commit_files(engine.files(engine.OPS + ["rope"]), "Add rope everywhere")
    assert audit(r.path, base, head).inference == base
    plain = GitRepo(tmp_path / "plain")
    b0 = plain.commit_files({"a.py": "x = 1\n"}, "one module")
    b1 = plain.commit_files({"a.py": "x = 2\n"}, "edit")
    found = audit(plain.path, b0, b1)
    assert found.inference == b0 and not found.rules_run and not found.inferred  # ran, found nothing
    off = parse_config("[settings]\ninfer = false\n")
    assert audit(r.path, base, head, off).inference == ""


def test_enums_private_to_two_kernels_are_no_rule_but_one_class_copied_is(tmp_path):
    # FlashMLA's fwd and MLA fwd mainloops each declare their own TmemAllocation: a PR changing one kernel's TMEM
    # layout is no drift. The same struct in a host and a device header is one class copied: kept in step.
    slots = "kSizeS = 128, kSizeO = 128, kSizeP = 32, S0 = 0, S1 = 128"

    def kernel(owner, body):
        return f"template <int N>\nstruct {owner} {{\n  enum class TmemAllocation : int {{\n    {body}\n  }};\n}};\n"

    r = GitRepo(tmp_path / "kernels")
    base = r.commit_files({"csrc/fwd.hpp": kernel("FwdMainloop", slots),
                           "csrc/fwd_mla.hpp": kernel("FwdMlaMainloop", slots)}, "two kernels")
    assert infer(Tree(str(r.path), base)).rules == []
    head = r.commit_files({"csrc/fwd.hpp": kernel("FwdMainloop", slots + ", O0 = 256")}, "fwd: one more slot")
    assert audit(r.path, base, head).findings == []
    c = GitRepo(tmp_path / "copied")
    base = c.commit_files({"csrc/host/layout.h": kernel("Layout", slots), "csrc/dev/layout.cuh": kernel("Layout", slots)},
                          "one struct, host and device")
    assert [x.kind for x in infer(Tree(str(c.path), base)).rules] == ["same-set"]
