"""The local executor on real subprocesses: outcomes, JUnit and metrics read-back, skips, kills."""

from __future__ import annotations

import json
import os
import time

import pytest

from checks.model import PlannedSuite, Results, from_json, to_json
from checks.model import TestPlan as Plan
from runner.local import classify, run_plan

PASSING = '''
def test_close(record_property):
    record_property("max_abs", 0.004)
    record_property("cos_diff", 1e-6)

def test_closer(record_property):
    record_property("max_abs", 0.001)
    record_property("first_divergence", 7)
'''

FAILING = '''
def test_ok():
    pass

def test_bad():
    assert 1 == 2, "values drifted"
'''

HARNESS = '''
import json, os
with open(os.environ["DRIFT_AUDIT_METRICS"], "a") as fh:
    fh.write(json.dumps({"name": "rmsnorm[bf16-4096]", "outcome": "passed", "duration": 0.5,
                         "metrics": {"max_abs": 0.0078, "rel": 0.002}}) + "\\n")
    fh.write(json.dumps({"name": "rmsnorm[fp32-7]", "outcome": "failed", "message": "max_abs 0.3 > 0.01",
                         "metrics": {"max_abs": 0.3}}) + "\\n")
    fh.write("not json\\n")
    fh.write(json.dumps({"metrics": {"near_tie_margin": 0.02}}) + "\\n")
'''

SPAWNER = '''
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open("child.pid", "w").write(str(child.pid))
time.sleep(120)
'''


def suite(sid, command, runner="cpu", **kw):
    return PlannedSuite(id=sid, kind=kw.pop("kind", "unit"), command=command, runner=runner, **kw)


@pytest.fixture
def tree(tmp_path):
    d = tmp_path / "head"
    d.mkdir()
    (d / "test_pass_metrics.py").write_text(PASSING)
    (d / "test_fail_some.py").write_text(FAILING)
    (d / "harness.py").write_text(HARNESS)
    (d / "spawner.py").write_text(SPAWNER)
    return d


def run(tree, suites, **kw):
    plan = Plan(audit_id="aid", head_sha="abc", suites=suites)
    results = run_plan(plan, str(tree), capability=kw.pop("capability", "cpu"), **kw)
    assert from_json(Results, to_json(results)) == results
    return {r.suite: r for r in results.suites}, results


def test_pytest_results_and_record_property_metrics(tree):
    got, results = run(tree, [
        suite("pass", "python -m pytest -q test_pass_metrics.py"),
        suite("fail", "pytest -q test_fail_some.py"),
    ])
    ok = got["pass"]
    assert ok.outcome == "passed" and ok.output_tail == ""
    assert [c.outcome for c in ok.cases] == ["passed", "passed"]
    assert ok.cases[0].name == "test_pass_metrics::test_close"
    assert ok.cases[0].metrics == {"max_abs": 0.004, "cos_diff": 1e-6}
    assert ok.metrics == {"max_abs": 0.004, "cos_diff": 1e-6, "first_divergence": 7}
    bad = got["fail"]
    assert bad.outcome == "failed" and bad.reason == "1 of 2 test(s) failed"
    assert "values drifted" in bad.output_tail
    assert [c.outcome for c in bad.cases] == ["passed", "failed"]
    assert "values drifted" in bad.cases[1].message
    assert results.devices[0].label == "cpu" and results.devices[0].gpu is None


def test_harness_metrics_lines(tree):
    got, _ = run(tree, [suite("h", "python harness.py", kind="parity")])
    r = got["h"]
    assert r.outcome == "failed"
    assert "1 of 2 case(s) reported failure" in r.reason and "1 malformed line(s)" in r.reason
    assert [(c.name, c.outcome) for c in r.cases] == [("rmsnorm[bf16-4096]", "passed"), ("rmsnorm[fp32-7]", "failed")]
    assert r.metrics == {"near_tie_margin": 0.02, "max_abs": 0.3, "rel": 0.002}


@pytest.mark.parametrize("command,outcome,reason", [
    ("python -c 'import ctypes; ctypes.string_at(0)'", "segfault", "killed by SIGSEGV"),
    ("python -c 'import os; os.abort()'", "abort", "killed by SIGABRT"),
    ("echo start && python -c 'import ctypes; ctypes.string_at(0)' && echo never", "segfault", "killed by SIGSEGV"),
    ("echo 'RuntimeError: CUDA error: an illegal memory access was encountered' >&2; exit 1", "cuda-error",
     "RuntimeError: CUDA error: an illegal memory access was encountered"),
    ("exit 3", "error", "exit code 3"),
    ("kill -9 $$", "error", "killed by SIGKILL (out of memory?)"),
])
def test_crash_outcomes_are_distinct(tree, command, outcome, reason):
    got, _ = run(tree, [suite("c", command)])
    assert (got["c"].outcome, got["c"].reason) == (outcome, reason)


def test_timeout_kills_the_whole_group(tree):
    start = time.monotonic()
    got, _ = run(tree, [suite("slow", "python spawner.py", timeout=1.5)])
    assert time.monotonic() - start < 15
    assert got["slow"].outcome == "timeout" and got["slow"].reason == "killed after the 1.5 s timeout"
    pid = int((tree / "child.pid").read_text())
    for _ in range(50):  # the grandchild was in the same group; give the kernel a moment to reap it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {pid} survived the timeout kill")


def test_labels_and_requirements_skip_with_reasons(tree):
    suites = [
        suite("gpu", "exit 1", runner="sm90"),
        suite("mx", "exit 1", runner="sm120", requires="cc >= 12.0"),
        suite("cpu-ok", "true"),
    ]
    got, _ = run(tree, suites)
    assert (got["gpu"].outcome, got["gpu"].reason) == ("skipped", "needs sm90")
    assert got["mx"].reason == "needs sm120"
    assert got["cpu-ok"].outcome == "passed"

    got, results = run(tree, suites, capability="9.0")
    assert got["gpu"].outcome == "error"  # an sm90 machine runs it
    assert got["mx"].reason == "needs sm120; this machine is sm90 (cc 9.0 (stated))"
    assert results.devices[0].compute_capability == "9.0"

    got, _ = run(tree, [suite("mx", "true", runner="sm120", requires="cc >= 12.1")], capability="12.0")
    assert got["mx"].reason == "needs cc >= 12.1; this machine has cc 12.0"

    got, _ = run(tree, suites, capability="9.0", labels=["sm90"])
    assert list(got) == ["gpu"]


def test_no_tests_and_all_skipped(tree):
    (tree / "test_skips.py").write_text("import pytest\n\n@pytest.mark.skip(reason='needs a GPU')\ndef test_s():\n    pass\n")
    got, _ = run(tree, [suite("none", "pytest -q test_nothing_here.py -k nothing"),
                        suite("skips", "pytest -q test_skips.py")])
    assert got["none"].outcome == "error"
    assert got["skips"].outcome == "skipped" and "needs a GPU" in got["skips"].reason


def test_a_pytest_that_exits_0_before_its_report_is_an_error(tree):
    """A head's conftest can end the interpreter with status 0 before any test ran: that is no pass."""
    sub = tree / "quits"
    sub.mkdir()
    (sub / "conftest.py").write_text("import os\nos._exit(0)\n")
    (sub / "test_broken.py").write_text(FAILING)
    got, _ = run(tree, [suite("quits", "pytest -q quits/test_broken.py"), suite("plain", "true")])
    assert got["quits"].outcome == "error" and "without writing its test report" in got["quits"].reason
    assert got["plain"].outcome == "passed"  # a command that is not pytest owes no report


def test_progress_and_bad_repo_dir(tree):
    lines = []
    run(tree, [suite("a", "true"), suite("b", "true", runner="sm90")], progress=lines.append)
    assert lines == ["[1/2] a on cpu: running", lines[1], "[2/2] b on sm90: skipped (needs sm90)"]
    assert lines[1].startswith("[1/2] a on cpu: passed in ")
    with pytest.raises(ValueError, match="not a directory"):
        run_plan(Plan("a", "b", []), str(tree / "missing"), capability="cpu")


def test_classify_shell_signal_codes():
    assert classify(139, False, 1, "", [], False) == ("segfault", "killed by SIGSEGV")
    assert classify(134, False, 1, "", [], False) == ("abort", "killed by SIGABRT")
    assert classify(0, False, 1, "CUDA error: in a passing log", [], False) == ("passed", "")
    assert classify(5, False, 1, "", [], True) == ("error", "pytest collected no tests (exit 5)")
    assert classify(5, False, 1, "", [], False) == ("error", "exit code 5")


GOLDEN = "\n".join([
    json.dumps({"format": "drift-audit-golden", "version": 1, "model": "tiny"}),
    json.dumps({"index": 0, "prompt": [1, 2], "tokens": [5, 6, 7, 8], "margins": [2.0, 0.01, 3.0, 3.0]}),
    json.dumps({"index": 1, "prompt": [3], "tokens": [9, 9, 9], "margins": [1.0, 1.0, 4.0]}),
]) + "\n"

WRITE_CANDIDATE = '''
import json, os, sys
t0, t1 = json.loads(sys.argv[1]), json.loads(sys.argv[2])
with open(os.environ["DRIFT_AUDIT_GOLDEN_OUT"], "w") as fh:
    fh.write(json.dumps({"index": 0, "prompt": [1, 2], "tokens": t0}) + "\\n")
    fh.write(json.dumps({"index": 1, "prompt": [3], "tokens": t1}) + "\\n")
'''


@pytest.mark.parametrize("t0,t1,outcome,reason,first", [
    ("[5,6,7,8]", "[9,9,9]", "passed", "", None),
    ("[5,4,7,8]", "[9,9,9]", "passed", "diverges from 'golden.jsonl' only at near-ties (first: prompt 0 step 1)", 1),
    ("[5,6,7,8]", "[9,9,1]", "failed",
     "1 of 2 prompt(s) break from 'golden.jsonl'; prompt 1 step 2: expected token 9, got 1 (reference margin 4)", 2),
    ("[5,6]", "[9,9,9]", "failed", "1 of 2 prompt(s) break from 'golden.jsonl'; prompt 0 stops at step 2", 2),
])
def test_decode_suite_compared_with_its_golden(tree, t0, t1, outcome, reason, first):
    (tree / "golden.jsonl").write_text(GOLDEN)
    (tree / "candidate.py").write_text(WRITE_CANDIDATE)
    got, _ = run(tree, [suite("dec", f"python candidate.py '{t0}' '{t1}'", kind="decode", golden="golden.jsonl")])
    r = got["dec"]
    assert (r.outcome, r.reason) == (outcome, reason)
    assert r.metrics.get("first_divergence") == first
    assert r.metrics["prompts"] == 2


def test_decode_suite_golden_problems(tree):
    (tree / "golden.jsonl").write_text(GOLDEN)
    got, _ = run(tree, [
        suite("silent", "true", kind="decode", golden="golden.jsonl"),
        suite("nofile", "true", kind="decode", golden="missing.jsonl"),
        suite("junk", "echo '{bad' > \"$DRIFT_AUDIT_GOLDEN_OUT\"", kind="decode", golden="golden.jsonl"),
        suite("crash", "exit 2", kind="decode", golden="golden.jsonl"),
    ])
    assert (got["silent"].outcome, got["silent"].reason) == ("failed", "the suite wrote no outputs to $DRIFT_AUDIT_GOLDEN_OUT")
    assert (got["nofile"].outcome, got["nofile"].reason) == ("error", "golden file 'missing.jsonl' is not in the head tree")
    assert got["junk"].outcome == "error" and "invalid JSON" in got["junk"].reason
    assert (got["crash"].outcome, got["crash"].reason) == ("error", "exit code 2")


def test_kernels_parity_json_is_read_as_cases(tree):
    report = {"device": {"label": "cpu"}, "passed": False, "rows": [], "cases": [
        {"name": "rmsnorm[1x7168 bf16]::out", "outcome": "passed", "duration": 0.01, "message": "",
         "metrics": {"metric": "allclose", "value": 0.5, "tol": 1.0}},
        {"name": "rmsnorm[1x7168 bf16]::out", "outcome": "passed", "duration": 0.01, "message": "",
         "metrics": {"metric": "max_abs", "value": 0.0078, "tol": 0.02}},
        {"name": "fp8_gemm[128x512 bf16]::out", "outcome": "failed", "duration": 0.02, "message": "2.1e-3 > 1e-3",
         "metrics": {"metric": "gemm_diff", "value": 0.0021, "tol": 0.001, "worst_index": [3, 7]}},
    ]}
    (tree / "report.json").write_text(json.dumps(report, indent=1))
    got, _ = run(tree, [suite("k", 'cp report.json "$DRIFT_AUDIT_METRICS"; exit 1', kind="parity")])
    r = got["k"]
    assert (r.outcome, r.reason) == ("failed", "1 of 3 test(s) failed")
    assert [c.metrics.get(c.metrics["metric"]) for c in r.cases] == [0.5, 0.0078, 0.0021]
    assert r.metrics == {"max_abs": 0.0078, "gemm_diff": 0.0021, "allclose": 0.5}


@pytest.mark.slow
def test_kernels_harness_through_the_executor():
    """A real parity run (Triton interpreter on CPU) reported through $DRIFT_AUDIT_METRICS."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    command = 'python -m bot.cli kernels parity --device cpu --op rmsnorm --case 3x1000 --json "$DRIFT_AUDIT_METRICS"'
    got, _ = run(root, [suite("parity-rmsnorm-cpu", command, kind="parity")])
    r = got["parity-rmsnorm-cpu"]
    assert r.outcome == "passed", r.output_tail
    assert [c.name for c in r.cases] == ["rmsnorm[3x1000 bfloat16]::out"]
    assert r.cases[0].metrics["allclose"] <= 1.0 and r.metrics["allclose"] == r.cases[0].metrics["allclose"]


# --------------------------------------------------------------------------- not runnable here

EXT_PKG = {  # a package whose compiled parts were never built on this machine
    "setup.py": "from setuptools import setup\nfrom torch.utils.cpp_extension import CUDAExtension\n"
                "setup(name='fastk', ext_modules=[CUDAExtension('fastk.fused_ops', ['csrc/a.cu'])])\n",
    "fastk/__init__.py": "from fastk import _C\n",
    "fastk/util.py": "def helper():\n    return 1\n",
    "fastk2/__init__.py": "",
    "fastk2/layer.py": "from fastk2.fused_ops import run\n",
    "tests/test_ext.py": "import fastk\n\n\ndef test_a():\n    pass\n",
    "tests/test_declared.py": "import fastk2.layer\n\n\ndef test_b():\n    pass\n",
    "tests/test_missing_dep.py": "import cutlass_dsl_not_installed\n\n\ndef test_c():\n    pass\n",
    "tests/test_broken_name.py": "from fastk2.layer_gone import x\n\n\ndef test_d():\n    pass\n",
    "tests/test_broken_attr.py": "import sys\nsys.path.insert(0, '.')\nfrom fastk2 import nothing_like_this\n\n\n"
                                 "def test_e():\n    pass\n",    "conf/conftest.py": "import fastk\n",
    "conf/test_under_conftest.py": "def test_f():\n    pass\n",
}


@pytest.fixture
def ext_tree(tmp_path):
    d = tmp_path / "ext"
    for rel, text in EXT_PKG.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


def test_unbuilt_extensions_and_missing_modules_are_not_runnable(ext_tree):
    got, _ = run(ext_tree, [
        suite("ext", "python -m pytest -q tests/test_ext.py"),
        suite("declared", "python -m pytest -q tests/test_declared.py"),
        suite("dep", "python -m pytest -q tests/test_missing_dep.py"),
        suite("all-three", "python -m pytest -q tests/test_ext.py tests/test_declared.py tests/test_missing_dep.py"),
        suite("script", "python -c 'import fastk'"),
        suite("conftest", "python -m pytest -q conf"),
    ])
    assert got["ext"].outcome == "not-runnable"
    assert got["ext"].reason == "1 test module(s) cannot be imported here: extension 'fastk._C' is not built here"
    assert got["declared"].reason.endswith("extension 'fastk2.fused_ops' is not built here")  # named by setup.py
    assert got["dep"].reason.endswith("module 'cutlass_dsl_not_installed' is not installed here")
    both = got["all-three"]
    assert both.outcome == "not-runnable" and "(and 2 other reason(s))" in both.reason
    assert [(c.name, c.outcome) for c in both.cases] == [
        ("tests.test_ext", "not-runnable"), ("tests.test_declared", "not-runnable"),
        ("tests.test_missing_dep", "not-runnable")]
    assert both.cases[0].message == "extension 'fastk._C' is not built here"
    assert (got["script"].outcome, got["script"].reason) == ("not-runnable", "extension 'fastk._C' is not built here")
    assert (got["conftest"].outcome, got["conftest"].reason) == ("not-runnable", "extension 'fastk._C' is not built here")
    for r in got.values():  # one line of reason, a few lines of tail: no tracebacks in the comment
        assert "\n" not in r.reason and "Traceback" not in r.reason
        assert len(r.output_tail) <= 600 and r.output_tail.count("\n") < 6


def test_import_errors_the_change_caused_still_fail(ext_tree):
    got, _ = run(ext_tree, [
        suite("gone-module", "python -m pytest -q tests/test_broken_name.py"),
        suite("gone-name", "python -m pytest -q tests/test_broken_attr.py"),
        suite("mixed", "python -m pytest -q tests/test_ext.py tests/test_broken_name.py"),
    ])
    assert {sid: r.outcome for sid, r in got.items()} == {"gone-module": "failed", "gone-name": "failed", "mixed": "failed"}
    assert "Traceback" in got["mixed"].output_tail or "ERROR" in got["mixed"].output_tail


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_no_cuda_is_not_runnable(tmp_path):
    (tmp_path / "test_cuda_module.py").write_text(
        "import torch\n\nX = torch.zeros(1, device='cuda')\n\n\ndef test_x():\n    assert X.sum() == 0\n")
    (tmp_path / "test_cuda_call.py").write_text(
        "import torch\n\n\ndef test_y():\n    assert torch.ones(2, device='cuda').sum() == 2\n")
    (tmp_path / "test_real_failure.py").write_text("def test_z():\n    assert 1 == 2\n")
    got, _ = run(tmp_path, [suite("mod", "python -m pytest -q test_cuda_module.py"),
                            suite("call", "python -m pytest -q test_cuda_call.py"),
                            suite("both", "python -m pytest -q test_cuda_call.py test_real_failure.py")])
    assert got["mod"].outcome == "not-runnable" and "Torch not compiled with CUDA enabled" in got["mod"].reason
    assert got["call"].outcome == "not-runnable" and got["call"].reason.startswith("no usable GPU here")
    assert got["both"].outcome == "failed"  # a real failure beside a missing GPU is still a failure


def test_not_runnable_does_not_fail_the_runner_exit_code(ext_tree, tmp_path):
    from runner.execute import execute

    plan = tmp_path / "plan.json"
    plan.write_text(to_json(Plan(audit_id="a", head_sha="", suites=[
        suite("ext", "python -m pytest -q tests/test_ext.py")])))
    out = tmp_path / "results.json"
    assert execute(str(plan), str(out), repo_dir=str(ext_tree), capability="cpu", log=lambda s: None) == 0
    assert json.loads(out.read_text())["suites"][0]["outcome"] == "not-runnable"


PARTLY_SKIPPED = '''
import pytest


def test_runs():
    assert True


def test_oracle():
    pytest.importorskip("nosuch_oracle_module")


def test_oracle_again():
    pytest.importorskip("nosuch_oracle_module")
'''


def test_a_pass_that_skipped_cases_says_so(tree):
    """Two of three tests never ran (their oracle is not installed): passed, but not silently."""
    (tree / "test_partly.py").write_text(PARTLY_SKIPPED)
    got, results = run(tree, [suite("p", "python -m pytest -q test_partly.py")])
    r = got["p"]
    assert r.outcome == "passed"
    assert r.reason == "2 of 3 tests skipped: could not import 'nosuch_oracle_module': No module named " \
                       "'nosuch_oracle_module'", r.reason
    from checks.model import Audit, AuditRequest, ChangeSet, Checkout, Findings, PillarMap
    from runner.report import render

    audit = Audit(AuditRequest("/r", "a", "b"), Checkout("/r", "a" * 40, "b" * 40, "a" * 40), "cfg",
                  ChangeSet("a" * 40, "b" * 40, "a" * 40), PillarMap(), Findings(rules_run=["x"]),
                  plan=Plan("aid", "abc", [suite("p", "python -m pytest -q test_partly.py")]), results=results)
    text = render(audit, "markdown")
    assert "| `p` | ✅ passed: 2 of 3 tests skipped: could not import 'nosuch\\_oracle\\_module'" in text
