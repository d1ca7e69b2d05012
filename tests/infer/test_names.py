"""Names a C++ file writes as strings or hands on: compared names, maps that spell their keys, functions and the
constant named like them."""

from __future__ import annotations

from tests.gitrepo import GitRepo
from tests.infer.audits import audit, inferred

TASKS = ["embedding", "rmsnorm", "linear", "attention", "silu"]


def graph(tasks: list[str]) -> str:
    body = "".join(f'  {"if" if i == 0 else "} else if"} (name == "{t}") {{\n    id = {i};\n' for i, t in enumerate(tasks))
    return f"int lookup(char const *task_type) {{\n  std::string name = task_type;\n  int id = -1;\n{body}  }}\n  return id;\n}}\n"


def layers(tasks: list[str]) -> str:
    return "".join(f'def {t}_layer(g):\n    g.register_task("{t}")\n\n' for t in tasks)


def test_a_name_the_cpp_dispatch_compares_misspelt_is_caught(tmp_path):
    r = GitRepo(tmp_path / "pk")
    base = r.commit_files({"src/graph.cc": graph(TASKS), "python/pk/layers.py": layers(TASKS)}, "five tasks")
    head = r.commit_files({"src/graph.cc": graph(["embedding", "rmsnorm", "linaer", "attention", "silu"])}, "typo")
    new = inferred(audit(r.path, base, head))
    assert new, "a misspelt dispatch name went unnoticed"
    assert any(f.message.startswith('"linaer" is in names compared with name (src/graph.cc:') for f in new), \
        [f.message for f in new]


def names_map(entries: dict[str, str]) -> str:
    rows = "".join(f'  task_type_to_name[{k}] = "{v}";\n' for k, v in entries.items())
    return f"void init_names() {{\n{rows}}}\n"


def test_a_map_misspelling_its_key_is_caught_and_a_map_of_descriptions_is_no_rule(tmp_path):
    keys = [f"TASK_{t.upper()}" for t in TASKS]
    r = GitRepo(tmp_path / "names")
    described = {k: f"{t} kernel" for k, t in zip(keys, TASKS, strict=True)}
    base = r.commit_files({"src/runtime.cc": names_map({k: k for k in keys}),
                           "src/describe.cc": names_map(described).replace("task_type_to_name", "task_help")}, "names")
    spelt = {k: k for k in keys} | {"TASK_LINEAR": "TASK_LINAER"}
    other = described | {"TASK_LINEAR": "dense layer"}
    head = r.commit_files({"src/runtime.cc": names_map(spelt),
                           "src/describe.cc": names_map(other).replace("task_type_to_name", "task_help")}, "edits")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1, [f.message for f in new]
    assert new[0].message.startswith('map entries of task_type_to_name spells its key `TASK_LINEAR` as "TASK_LINAER" '
                                     "at src/runtime.cc:"), new[0].message


def registers(pairs: list[tuple[str, str]]) -> str:
    return "".join(f"int register_{fn}_task(Graph &g) {{\n  return register_task_variant({const}, g.code());\n}}\n\n"
                   for fn, const in pairs)


def test_a_function_handing_on_another_functions_constant_is_caught(tmp_path):
    r = GitRepo(tmp_path / "reg")
    base = r.commit_files({"src/task_register.cc": registers([(t, f"TASK_{t.upper()}") for t in TASKS])}, "five")
    wrong = [(t, f"TASK_{t.upper()}") for t in TASKS]
    wrong[1] = ("rmsnorm", "TASK_EMBEDDING")
    head = r.commit_files({"src/task_register.cc": registers(wrong)}, "copy-paste")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1, [f.message for f in new]
    assert new[0].message.startswith("`register_rmsnorm_task` hands register_task_variant() `TASK_EMBEDDING` "
                                     "(src/task_register.cc:"), new[0].message


def test_functions_handing_constants_named_otherwise_are_no_rule(tmp_path):
    # Each function passes a mode, not its own name: nothing says which constant belongs to which function.
    modes = ["MODE_FAST", "MODE_SAFE", "MODE_SMALL", "MODE_WIDE", "MODE_DEEP"]
    r = GitRepo(tmp_path / "reg")
    base = r.commit_files({"src/task_register.cc": registers(list(zip(TASKS, modes, strict=True)))}, "five")
    swapped = list(zip(TASKS, [modes[1], modes[0], *modes[2:]], strict=True))
    head = r.commit_files({"src/task_register.cc": registers(swapped)}, "swap modes")
    assert inferred(audit(r.path, base, head)) == []


def test_a_cpp_enum_written_kCamel_keeps_in_step_with_its_python_mirror(tmp_path):
    # `kRoPELlama` and `ROPE_LLAMA` name one mode; `MaskMode::kCausal` labels name the enum's `kCausal`.
    modes = ["None", "RoPELlama", "ALiBi", "XPos"]
    py = ["NONE", "ROPE_LLAMA", "ALIBI", "XPOS"]

    def cpp(ms: list[str]) -> str:
        return "enum class PosEncodingMode {\n" + "".join(f"  k{m} = {i}U,\n" for i, m in enumerate(ms)) + "};\n"

    def python(ms: list[str]) -> str:
        return "from enum import Enum\n\nclass PosEncodingMode(Enum):\n" + "".join(f"    {m} = {i}\n" for i, m in enumerate(ms))

    r = GitRepo(tmp_path / "modes")
    base = r.commit_files({"include/lib/pos_enc.cuh": cpp(modes), "lib/utils.py": python(py)}, "four modes")
    head = r.commit_files({"include/lib/pos_enc.cuh": cpp(modes + ["YaRN"])}, "yarn in C++ only")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1, [f.message for f in new]
    assert new[0].message.startswith("`kYaRN` is in enum PosEncodingMode (include/lib/pos_enc.cuh:"), new[0].message
    assert "missing from enum class PosEncodingMode (lib/utils.py:" in new[0].message


def test_a_keyword_list_keeps_in_step_with_the_registry_it_names(tmp_path):
    # `choices=[...]` of a CLI flag lists the registry's backends: a backend registered and not offered is drift.
    backends = ["flash", "triton", "torch_sdpa", "flex"]

    def registry(names: list[str]) -> str:
        return "BACKENDS = {\n" + "".join(f'    "{n}": "{n}_impl",\n' for n in names) + "}\n"

    def cli(names: list[str]) -> str:
        return ("import argparse\np = argparse.ArgumentParser()\n"
                f'p.add_argument("--attention-backend", choices=[{", ".join(repr(n) for n in names)}])\n'
                'p.add_argument("--dtype", choices=["auto", "half", "bfloat16", "float"])\n')

    r = GitRepo(tmp_path / "cli")
    base = r.commit_files({"engine/attention/registry.py": registry(backends), "engine/args.py": cli(backends)}, "cli")
    head = r.commit_files({"engine/attention/registry.py": registry(backends + ["paged"])}, "paged backend")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1, [f.message for f in new]
    assert new[0].message.startswith('"paged" is in dict keys of BACKENDS (engine/attention/registry.py:'), new[0].message
    assert "missing from list choices (engine/args.py:" in new[0].message
