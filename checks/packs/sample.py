"""A persistent-kernel engine in miniature: the layout the ``persistent_kernel`` pack is written for.

The drift-check tests, the checks benchmark and ``drift-audit demo`` all build
real git repos from it.

``base_files()`` is consistent; ``clean_change`` adds one task everywhere it must
go; ``DRIFTS`` seeds one drift of each kind, each an edit of the base files.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

TASKS = [  # (name, enum value, new_input calls, outputs, params)
    ("embedding", 101, 2, 1, 1),
    ("rmsnorm", 102, 2, 1, 2),
    ("linear", 103, 2, 1, 3),
    ("attention", 104, 3, 1, 4),
    ("allreduce", 201, 1, 1, 1),
]

CONFIG = '''\
[settings]
packs = ["persistent_kernel"]

[[fact]]
id = "shard_demo"
lang = "python"
files = ["scripts/demo.py"]
query = """(assignment left: (identifier) @_n right: (dictionary (pair key: (string (string_content) @key) value: (_) @value)) (#eq? @_n "SHARD_RULES"))"""

[[fact]]
id = "shard_convert"
lang = "python"
files = ["python/engine/convert.py"]
query = """(assignment left: (identifier) @_n right: (dictionary (pair key: (string (string_content) @key) value: (_) @value)) (#eq? @_n "SHARD_RULES"))"""

[[fact]]
id = "decode_gate"
lang = "cuda"
files = ["kernels/*/decode_attention.cuh"]
query = """(if_statement condition: (condition_clause value: (binary_expression) @key) consequence: [(return_statement) (compound_statement (return_statement))])"""

[[fact]]
id = "prefill_gate"
lang = "cuda"
files = ["kernels/sm90/prefill_attention.cuh"]
query = """(if_statement condition: (condition_clause value: (binary_expression) @key) consequence: [(return_statement) (compound_statement (return_statement))])"""

[[fact]]
id = "py_flags"
lang = "python"
files = ["python/engine/config.py"]
query = """(module (expression_statement (assignment left: (identifier) @key right: (_) @value)))"""

[[fact]]
id = "mla_constants"
lang = "cpp"
files = ["include/engine/mla.h"]
query = """(declaration (type_qualifier) declarator: (init_declarator declarator: (identifier) @key value: (_) @value))"""

[[rule]]
id = "shard-tables-agree"
kind = "table-equal"
facts = ["shard_demo", "shard_convert"]
pillar = "weights"

[[rule]]
id = "attention-gates-partition"
kind = "gate-coverage"
facts = ["decode_gate", "prefill_gate"]
reject = ["decode_gate", "prefill_gate"]
range = [1, 4096]
pillar = "topology"

[[rule]]
id = "mtp-prefill-pinned"
kind = "pinned"
facts = ["py_flags"]
values = { use_mtp_prefill_attention = "True" }
pillar = "runtime"

[[rule]]
id = "kv-token-bytes"
kind = "derived"
facts = ["mla_constants", "py_flags"]
expr = "TOKEN_BYTES == NOPE_DIM + ROPE_DIM*2 + SCALE_DIM == 584"
pillar = "topology"
'''


def _header(tasks) -> str:
    compute = [t for t in tasks if t[1] < 200]
    comm = [t for t in tasks if t[1] >= 200]
    lines = ["#pragma once", "namespace engine {", "enum TaskType {", "  TASK_COMPUTE_BEGIN = 100,"]
    lines += [f"  TASK_{n.upper()} = {v}," for n, v, *_ in compute]
    lines += ["  TASK_COMPUTE_END = 199,", "  TASK_COMM_BEGIN = 200,"]
    lines += [f"  TASK_{n.upper()} = {v}," for n, v, *_ in comm]
    lines += ["  TASK_COMM_END = 299,", "};", "}  // namespace engine", ""]
    return "\n".join(lines)


def _decls(tasks) -> str:
    body = "\n".join(
        f"int register_{n}_task(threadblock::Graph const &bgraph, std::vector<int> const &params);" for n, *_ in tasks
    )
    return f'#pragma once\n#include <vector>\n#include "runtime_header.h"\nnamespace engine {{\n{body}\n}}  // namespace engine\n'


def _defs(tasks) -> str:
    out = ['#include "task_register.h"', "#include <cassert>", "namespace engine {", ""]
    for n, _, ins, outs, params in tasks:
        out += [
            f"int register_{n}_task(threadblock::Graph const &bgraph, std::vector<int> const &params) {{",
            f"  assert(params.size() == {params});",
            f"  int num_inputs = {ins};",
            f"  int num_outputs = {outs};",
            f'  std::string code = emit_{n}(bgraph, params);',
            f"  return register_task_variant(TASK_{n.upper()}, code);",
            "}",
            "",
        ]
    out += ["}  // namespace engine", ""]
    return "\n".join(out)


def _graph(tasks) -> str:
    out = [
        '#include "task_register.h"',
        "namespace engine {",
        "void Graph::register_task(char const *task_type, std::vector<int> const &params) {",
        "  std::string name = std::string(task_type);",
        "  int variant_id = 0;",
    ]
    for i, (n, _, ins, outs, _) in enumerate(tasks):
        head = "  if" if i == 0 else "  } else if"
        out += [
            f'{head} (name == "{n}") {{',
            f"    variant_id = register_{n}_task(bgraph, params);",
            f"    task_config[op] = std::make_tuple({ins}, {outs}, TASK_{n.upper()}, variant_id);",
        ]
    out += ["  } else {", '    assert(false && "unsupported task");', "  }", "}", "}  // namespace engine", ""]
    return "\n".join(out)


def _runtime(tasks) -> str:
    out = ['#include "runtime_header.h"', "namespace engine {", "void Runtime::init_names() {"]
    out += [f'  task_type_to_name[TASK_{n.upper()}] = "TASK_{n.upper()}";' for n, *_ in tasks]
    one = " || ".join(f"task_type == TASK_{n.upper()}" for n, v, *_ in tasks if v < 200 and n != "attention" and n != "linear")
    two = " || ".join(f"task_type == TASK_{n.upper()}" for n in ("linear", "attention"))
    out += [
        "}",
        "",
        "int Runtime::num_metadata(TaskType task_type) {",
        f"  if ({one}) {{",
        "    return 1;",
        f"  }} else if ({two}) {{",
        "    return 2;",
        "  }",
        "  return 0;",
        "}",
        "}  // namespace engine",
        "",
    ]
    return "\n".join(out)


def _task_header(tasks) -> str:
    return "#pragma once\n#include \"common.cuh\"\n" + "".join(f'#include "{n}.cuh"\n' for n, *_ in tasks)


def _wrapper(tasks) -> str:
    out = [
        "from engine.graph import TBGraph",
        "",
        "",
        "class PersistentKernel:",
        "    def __init__(self, kn_graph):",
        "        self.kn_graph = kn_graph",
    ]
    for n, _, ins, outs, params in tasks:
        args = [f"x{i}" for i in range(ins)]
        out += ["", f"    def {n}_layer(self, {', '.join(args)}, out, residual=None):", "        tb_graph = TBGraph(grid_dim=(1, 1, 1))"]
        fixed = args[:-1] if n == "attention" else args  # attention's last input is optional
        out += [f"        tb_graph.new_input({a})" for a in fixed]
        if n == "attention":
            out += ["        if residual is not None:", f"            tb_graph.new_input({args[-1]})"]
        out += ["        tb_graph.new_output(out)" for _ in range(outs)]
        plist = ", ".join(str(10 + i) for i in range(params))
        out += [f'        self.kn_graph.register_task(tb_graph, "{n}", [{plist}])']
    return "\n".join(out) + "\n"


SHARDS = '''SHARD_RULES = {
    "wq_a": ("col", 0),
    "wkv_a": ("col", 0),
    "wo": ("row", 1),
    "w1": ("col", 0),
    "w2": ("row", 1),
}
'''

FLAGS = """KV_LORA_RANK = 512
use_mtp_prefill_attention = True
max_batch_tokens = 4096
"""

MLA = """#pragma once
constexpr int ROPE_DIM = 64;
constexpr int NOPE_DIM = KV_LORA_RANK - ROPE_DIM;
constexpr int SCALE_DIM = NOPE_DIM / 56;
constexpr int TOKEN_BYTES = NOPE_DIM + ROPE_DIM * 2 + SCALE_DIM;
"""

DECODE = """#pragma once
template <int Q_LEN>
__device__ void decode_attention(float const *q, float *out) {
  if (Q_LEN > 8) {
    return;
  }
  out[threadIdx.x] = q[threadIdx.x];
}
"""

PREFILL = """#pragma once
template <int Q_LEN>
__device__ void prefill_attention(float const *q, float *out) {
  if (Q_LEN < 9) return;
  out[threadIdx.x] = 2 * q[threadIdx.x];
}
"""


def files_for(tasks) -> dict[str, str]:
    files = {
        ".github/drift-audit.toml": CONFIG,
        "include/engine/runtime_header.h": _header(tasks),
        "include/engine/task_register.h": _decls(tasks),
        "include/engine/mla.h": MLA,
        "src/task_register.cc": _defs(tasks),
        "src/graph.cc": _graph(tasks),
        "src/runtime.cc": _runtime(tasks),
        "python/engine/persistent_kernel.py": _wrapper(tasks),
        "python/engine/convert.py": "import torch\n\n" + SHARDS,
        "python/engine/config.py": FLAGS,
        "scripts/demo.py": "# Demo of TP sharding.\n" + SHARDS,
        "kernels/sm90/decode_attention.cuh": DECODE,
        "kernels/sm90/prefill_attention.cuh": PREFILL,
        "kernels/common.cuh": "#pragma once\n",
        "README.md": "engine\n",
    }
    for arch in ("sm90", "sm100"):
        files[f"kernels/{arch}/task_header.cuh"] = _task_header(tasks)
    for n, *_ in tasks:
        files[f"kernels/{n}.cuh"] = f"#pragma once\n// {n} kernel\n"
    return files


def base_files() -> dict[str, str]:
    return files_for(TASKS)


def clean_change(files: dict[str, str]) -> dict[str, str]:
    """A large change that adds TASK_TOPK_SOFTMAX consistently in every place it must go."""
    new = files_for(TASKS[:4] + [("topk_softmax", 105, 2, 2, 3)] + TASKS[4:])
    new["python/engine/convert.py"] = new["python/engine/convert.py"].replace('    "w2"', '    "gate": ("replicate", -1),\n    "w2"')
    new["scripts/demo.py"] = new["scripts/demo.py"].replace('    "w2"', '    "gate": ("replicate", -1),\n    "w2"')
    return new


def _edit(path: str, old: str, new: str):
    def apply(files: dict[str, str]) -> dict[str, str]:
        assert old in files[path], (path, old)
        return {**files, path: files[path].replace(old, new, 1)}

    return apply


# kind → (rule id that must fire, edit seeding the drift)
DRIFTS = {
    "missing-name-map-entry": (
        "pk-task-wiring",
        _edit("src/runtime.cc", '  task_type_to_name[TASK_ATTENTION] = "TASK_ATTENTION";\n', ""),
    ),
    "wrong-returned-task": (
        "pk-register-returns-own-task",
        _edit("src/task_register.cc", "register_task_variant(TASK_RMSNORM, code)", "register_task_variant(TASK_EMBEDDING, code)"),
    ),
    "declared-not-defined": (
        "pk-register-declared-defined",
        _edit(
            "include/engine/task_register.h",
            "}  // namespace engine",
            "int register_topk_task(threadblock::Graph const &bgraph, std::vector<int> const &params);\n}  // namespace engine",
        ),
    ),
    "tuple-vs-new-input": (
        "pk-inputs-arity",
        _edit("src/graph.cc", "std::make_tuple(2, 1, TASK_RMSNORM", "std::make_tuple(3, 1, TASK_RMSNORM"),
    ),
    "missing-include": ("pk-task-wiring", _edit("kernels/sm100/task_header.cuh", '#include "linear.cuh"\n', "")),
    "shard-tables-differ": (
        "shard-tables-agree",
        _edit("scripts/demo.py", '"wo": ("row", 1)', '"wo": ("col", 1)'),
    ),
    "gate-gap": ("attention-gates-partition", _edit("kernels/sm90/prefill_attention.cuh", "Q_LEN < 9", "Q_LEN < 16")),
    "bare-operand": (
        "pk-metadata-bare-operand",
        _edit("src/runtime.cc", "task_type == TASK_LINEAR || task_type == TASK_ATTENTION", "task_type == TASK_LINEAR || (TASK_ATTENTION)"),
    ),
    "pinned-flag": (
        "mtp-prefill-pinned",
        _edit("python/engine/config.py", "use_mtp_prefill_attention = True", "use_mtp_prefill_attention = False"),
    ),
    "derived-constant": ("kv-token-bytes", _edit("include/engine/mla.h", "ROPE_DIM = 64", "ROPE_DIM = 72")),
    # The rest of the persistent_kernel pack.
    "params-length": (
        "pk-param-count",
        _edit("python/engine/persistent_kernel.py", '"rmsnorm", [10, 11]', '"rmsnorm", [10, 11, 12]'),
    ),
    "dispatch-name": ("pk-dispatch-name", _edit("src/graph.cc", 'name == "linear"', 'name == "linaer"')),
    "name-map-spelling": (
        "pk-name-map-spelling",
        _edit("src/runtime.cc", '= "TASK_LINEAR";', '= "TASK_LINAER";'),
    ),
    "outputs-arity": (
        "pk-outputs-arity",
        _edit(
            "python/engine/persistent_kernel.py",
            '        tb_graph.new_output(out)\n        self.kn_graph.register_task(tb_graph, "embedding"',
            '        tb_graph.new_output(out)\n        tb_graph.new_output(out)\n        self.kn_graph.register_task(tb_graph, "embedding"',
        ),
    ),
}


def all_drifts(files: dict[str, str]) -> dict[str, str]:
    for _, apply in DRIFTS.values():
        files = apply(files)
    return files


# --------------------------------------------------------------------------- git


def git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "Dev",
        "GIT_AUTHOR_EMAIL": "dev@example.com",
        "GIT_COMMITTER_NAME": "Dev",
        "GIT_COMMITTER_EMAIL": "dev@example.com",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(repo),
    }
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


def init_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    return path


def commit_over(repo: Path, files: dict[str, str | None], message: str = "change") -> str:
    """Write ``files`` over the work tree (``None`` deletes one), stage everything and commit; the new sha."""
    for rel, text in files.items():
        p = repo / rel
        if text is None:
            p.unlink()
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    """Make the work tree exactly ``files`` and commit; returns the new sha."""
    gone = {old: None for old in git(repo, "ls-files").splitlines() if old not in files}
    return commit_over(repo, {**gone, **files}, message)
