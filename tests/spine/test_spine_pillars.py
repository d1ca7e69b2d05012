"""Hunks → pillars by path glob and by enclosing symbol, with tree-sitter on each side."""

from checks.config import parse_config
from checks.diff import build_changeset
from checks.model import AuditRequest
from checks.pillars import map_pillars, symbols_in, touched_symbols
from checks.workspace import checkout

CONFIG = """
[[pillar]]
id = "wiring"
title = "Task wiring"
paths = ["src/kernel/**", "include/**/tasks/**"]
symbols = ["python/**/persistent_kernel.py::*_layer"]

[[pillar]]
id = "runtime"
title = "Runtime"
paths = ["src/runtime/**"]
symbols = ["**/*.cu::mk::*::step"]
"""

WRAPPER = '''class PersistentKernel:
    def rmsnorm_layer(self, x):
        a = 1
        return a

    def helper(self):
        return 0
'''


def audit_pillars(repo, base):
    co = checkout(AuditRequest(repo=str(repo.root), base=base, head="HEAD"))
    return map_pillars(co, parse_config(CONFIG), build_changeset(co))


def test_path_and_symbol_pillars(repo):
    repo.write("python/mk/persistent_kernel.py", WRAPPER)
    repo.write("src/kernel/graph.cc", "int graph() {\n  return 1;\n}\n")
    repo.write("README.md", "hello\n")
    base = repo.commit("base")
    repo.write("python/mk/persistent_kernel.py", WRAPPER.replace("a = 1", "a = 2").replace("return 0", "return 3"))
    repo.write("src/kernel/graph.cc", "int graph() {\n  return 2;\n}\n")
    repo.write("README.md", "hello again\n")
    repo.commit("head")
    pm = audit_pillars(repo, base)
    wiring = pm.get("wiring")
    assert sorted(wiring.files) == ["python/mk/persistent_kernel.py", "src/kernel/graph.cc"]
    assert "python/mk/persistent_kernel.py::PersistentKernel.rmsnorm_layer" in wiring.symbols
    assert "src/kernel/graph.cc::graph" in wiring.symbols
    reasons = {(t.path, t.reason, t.pattern) for t in wiring.touches}
    assert ("python/mk/persistent_kernel.py", "symbol", "python/**/persistent_kernel.py::*_layer") in reasons
    assert ("src/kernel/graph.cc", "path", "src/kernel/**") in reasons
    # helper() matches no pattern, README matches no glob: both fall to "other"
    other = pm.get("other")
    assert "README.md" in other.files
    assert "python/mk/persistent_kernel.py::PersistentKernel.helper" in other.symbols
    assert pm.get("runtime") is None
    rows = {(r.path, r.symbol): r.pillars for r in pm.hunks}
    assert rows[("python/mk/persistent_kernel.py", "PersistentKernel.rmsnorm_layer")] == ["wiring"]


def test_deleted_lines_use_the_base_symbol(repo):
    repo.write("src/runtime/step.cu",
               "namespace mk {\nnamespace rt {\n__global__ void step(int* x) {\n  x[0] = 1;\n  x[1] = 2;\n}\n}\n}\n")
    base = repo.commit("base")
    repo.write("src/runtime/step.cu", "namespace mk {\nnamespace rt {\n__global__ void step(int* x) {\n  x[0] = 1;\n}\n}\n}\n")
    repo.commit("head")
    pm = audit_pillars(repo, base)
    runtime = pm.get("runtime")
    assert runtime.symbols == ["src/runtime/step.cu::mk::rt::step"]
    assert {t.reason for t in runtime.touches} == {"path", "symbol"}


def test_cpp_qualified_names_and_innermost():
    src = b"""namespace mk {
struct Graph {
  int add(int a) {
    return a + 1;
  }
};
int Graph::register_rmsnorm_task(int x) {
  return x;
}
}
"""
    syms = symbols_in("cpp", src)
    names = {s.name for s in syms}
    assert names == {"mk::Graph", "mk::Graph::add", "mk::Graph::register_rmsnorm_task"}  # namespaces only qualify
    assert touched_symbols(syms, [4]) == [("mk::Graph::add", 4)]
    assert touched_symbols(syms, [8, 4]) == [("mk::Graph::add", 4), ("mk::Graph::register_rmsnorm_task", 8)]


def test_python_nested_and_decorated():
    src = b"""import x

class A:
    @staticmethod
    def f():
        def g():
            return 1
        return g
"""
    syms = symbols_in("python", src)
    assert touched_symbols(syms, [7]) == [("A.f.g", 7)]
    assert touched_symbols(syms, [4]) == [("A.f", 4)]  # a decorator line belongs to its function
    assert touched_symbols(syms, [1]) == []


def test_binary_and_rename_only_changes_map_by_path(repo):
    repo.write("src/kernel/table.bin", bytes(range(256)))
    repo.write("src/kernel/a.h", "int a();\n")
    base = repo.commit("base")
    repo.write("src/kernel/table.bin", bytes(range(255, -1, -1)))
    repo.mv("src/kernel/a.h", "include/mk/tasks/a.h")
    repo.commit("head")
    wiring = audit_pillars(repo, base).get("wiring")
    assert sorted(wiring.files) == ["include/mk/tasks/a.h", "src/kernel/table.bin"]
