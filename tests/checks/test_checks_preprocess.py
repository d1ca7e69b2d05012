"""C/C++/CUDA macro forms are blanked before parsing: same bytes count and lines, no ERROR node, right rows."""

from __future__ import annotations

import pytest

from checks import syntax
from checks.config import Fact
from checks.facts import extract_text
from checks.preprocess import preprocess

CASES = {
    "align": b"extern __shared__ __align__(1024) uint8_t smem[];\n",
    "attribute macro": b"CUTLASS_DEVICE static void f(int a) {}\n",
    "after constexpr": b"constexpr CUTLASS_HOST_DEVICE int g(int a) { return a; }\n",
    "pragma macro": b"void f() {\n  CUTLASS_PRAGMA_UNROLL\n  for (int i = 0; i < 4; ++i) {}\n}\n",
    "#if with and": b"#if defined(X) and X >= 1\nint a;\n#endif\n",
    "#if branches with one brace each": b"#if A\nvoid f() {\n#else\nvoid g() {\n#endif\n  return;\n}\n",
    "alignas macro": b"CUTE_ALIGNAS(16) char x[4];\n",
    "file-local attribute define": b"#define DFN __device__ __forceinline__\nDFN int f(int a) { return a; }\n",
    "macro call with no ;": b"int a;\nDEFINE_OP(rms)\nint b;\n",
}


@pytest.mark.parametrize("name", list(CASES))
def test_blanked_source_parses_and_keeps_offsets(name):
    data = CASES[name]
    out = preprocess(data)
    assert len(out) == len(data) and [i for i, c in enumerate(out) if c == 10] == [i for i, c in enumerate(data) if c == 10]
    assert all(a == b or b == 32 for a, b in zip(data, out))  # only blanks, never new text
    assert syntax.parse("cuda", data).root_node.has_error
    assert not syntax.parse("cuda", out).root_node.has_error


def test_code_that_looks_like_a_macro_is_kept():
    kept = [
        b"enum T {\n  TASK_A,\n  TASK_END\n};\n",  # a last enumerator on its own line
        b"int x = foo(a,\n  BAR_X(1)\n);\n",  # a macro call as an argument
        b"#include \"x.cuh\"\n#define N 4\n",  # includes and value defines
        b"__global__ void __launch_bounds__(128, 1) k(int a) {}\n",  # the grammar reads launch bounds
    ]
    for data in kept[:3]:
        assert preprocess(data) == data
    assert b"__launch_bounds__(128, 1)" in preprocess(kept[3])


def test_if_zero_keeps_the_else_branch():
    out = preprocess(b"#if 0\nvoid f() {\n#else\nvoid g() {\n#endif\n  return;\n}\n")
    assert b"void f" not in out and b"void g" in out


def test_macros_in_parameter_lists_no_longer_miscount():
    fact = Fact("fn", "cuda", ["*.cu"], options={"len": ["n"]},
                query="(function_definition declarator: (function_declarator declarator: (identifier) @key parameters: (parameter_list) @n))")
    src = b"CUTLASS_GLOBAL void k(CUTE_GRID_CONSTANT Params const p, int n) {}\nCUTLASS_DEVICE int g(int a, int b) { return a; }\n"
    rows, problem = extract_text(fact, "a.cu", src)
    assert [(r.key, r.values["n"], r.line) for r in rows] == [("k", 2, 1), ("g", 2, 2)] and problem is None
    raw = Fact(fact.id, fact.lang, fact.files, query=fact.query, options={**fact.options, "preprocess": False})
    rows, problem = extract_text(raw, "a.cu", src)
    assert rows[0].values["n"] == 3 and problem is not None  # what the grammar alone makes of it


def test_cuda_keywords_are_blanked_for_the_cpp_grammar_only():
    data = b"static __constant__ uint4 X = {1, 2};\n__device__ __forceinline__ int f(int* __restrict__ a) { return 0; }\n"
    assert syntax.parse("cpp", data).root_node.has_error
    assert not syntax.parse("cpp", preprocess(data, "cpp")).root_node.has_error
    assert b"__device__" in preprocess(data, "cuda")  # the CUDA grammar reads them: facts may query them
