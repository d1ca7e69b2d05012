"""The parity harness: metrics, poisoning, NaN handling, error rows, table/JSON output, registry and CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from kernels import metrics as M
from kernels.arch import capability, fp8_hw_cast, interpreting
from kernels.harness import Case, Check, ParitySpec, Row, Skip, format_table, poison, results_json, run_spec
from kernels.registry import OPS, load_spec
from tests.kernels.interpreter import KERNEL_DEVICE, interpreter

MY_OPS = ["rmsnorm", "rmsnorm_residual", "act_quant", "act_quant_ue8m0", "act_dequant", "weight_dequant",
          "rope", "silu_mul", "silu_mul_quant"]


def test_max_abs_names_the_worst_element():
    ref = torch.zeros(3, 4)
    out = ref.clone()
    out[1, 2] = 0.5
    out[2, 3] = -0.25
    m = M.max_abs(out, ref)
    assert m.value == 0.5 and m.worst_index == (1, 2) and m.worst_value == 0.5 and m.ref_value == 0.0


def test_allclose_passes_at_one_and_treats_equal_infinities_as_exact():
    ref = torch.tensor([1.0, 100.0, float("inf")])
    out = torch.tensor([1.01, 101.0, float("inf")])
    m = M.allclose(out, ref, atol=0.0, rtol=0.01)
    assert m.value == pytest.approx(1.0, rel=1e-6)
    assert M.allclose(out, ref, atol=0.0, rtol=0.005).value == pytest.approx(2.0, rel=1e-6)


def test_max_rel_floor_keeps_near_zero_references_from_dominating():
    ref = torch.tensor([1e-9, 1.0])
    out = torch.tensor([2e-9, 1.001])
    assert M.max_rel(out, ref, floor=1e-3).worst_index == (1,)


def test_bit_exact_counts_differing_bits_including_signed_zero():
    ref = torch.tensor([0.0, 1.0, 2.0], dtype=torch.bfloat16)
    out = torch.tensor([-0.0, 1.0, 2.015625], dtype=torch.bfloat16)
    m = M.bit_exact(out, ref)
    assert m.value == 2 and m.worst_index == (0,)
    fp8 = torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn)
    assert M.bit_exact(fp8, fp8.clone()).value == 0
    with pytest.raises(ValueError, match="dtype"):
        M.bit_exact(ref, ref.float())


def test_gemm_diff_and_cos_diff():
    x = torch.randn(64, 32, dtype=torch.float64)
    assert M.gemm_diff(x, x).value == pytest.approx(0.0, abs=1e-15)
    assert M.gemm_diff(-x, x).value == pytest.approx(2.0)
    # cos_diff ignores magnitude, gemm_diff does not: 1 − 2·2/(4+1) = 0.2
    assert M.cos_diff(2 * x, x).value == pytest.approx(0.0, abs=1e-12)
    assert M.gemm_diff(2 * x, x).value == pytest.approx(0.2)


def test_lse_abs_treats_empty_rows_as_exact():
    ref = torch.tensor([float("-inf"), 3.0])
    assert M.lse_abs(torch.tensor([float("-inf"), 3.0 + 2**-20]), ref).value == 2**-20


def test_poison_values():
    f = poison(torch.zeros(4))
    assert torch.isnan(f).all()
    q = poison(torch.zeros(4, dtype=torch.float8_e4m3fn))
    assert torch.isnan(q.float()).all()
    i = poison(torch.zeros(4, dtype=torch.int32))
    assert (i == torch.iinfo(torch.int32).min).all()


def _copy_spec(kernel, checks=None, cases=None) -> ParitySpec:
    def inputs(case, device, gen):
        return {"x": torch.randn(case.params["n"], generator=gen, device=device)}

    return ParitySpec(
        op="copy", make_inputs=inputs, reference=lambda x: x * 2, kernel=kernel,
        cases=cases or [Case("n7", {"n": 7}, dtype=torch.float32)],
        checks=checks or [Check("max_abs", 0.0, "exact")],
    )


def test_an_element_never_written_fails_with_its_index():
    def skips_last(out, x):
        out[0][:-1] = x[:-1] * 2

    [row] = run_spec(_copy_spec(skips_last))
    assert row.outcome == "failed"
    assert "NaN in output at [6]" in row.message and "never written" in row.message


def test_nan_fails_even_where_the_metric_would_pass():
    def writes_nan(out, x):
        out[0].copy_(x * 2)
        out[0][3] = float("nan")

    [row] = run_spec(_copy_spec(writes_nan, checks=[Check("max_abs", float("inf"), "any")]))
    assert row.outcome == "failed" and "[3]" in row.message


def test_failure_message_has_worst_index_value_and_reference():
    def off_by_one(out, x):
        out[0].copy_(x * 2)
        out[0][5] += 1.0

    rows = run_spec(_copy_spec(off_by_one))
    assert rows[0].outcome == "failed"
    assert "worst at [5]" in rows[0].message and "reference" in rows[0].message
    assert rows[0].worst_index == [5]
    table = format_table(rows)
    assert "FAILED" in table and "worst at [5]" in table and "0/1 checks passed" in table


def test_a_raising_kernel_is_an_error_row_and_the_sweep_continues():
    def sometimes_raises(out, x):
        if x.numel() == 3:
            raise RuntimeError("boom")
        out[0].copy_(x * 2)

    spec = _copy_spec(sometimes_raises, cases=[Case("n3", {"n": 3}, dtype=torch.float32),
                                               Case("n5", {"n": 5}, dtype=torch.float32)])
    rows = run_spec(spec)
    assert [r.outcome for r in rows] == ["error", "passed"]
    assert "RuntimeError: boom" in rows[0].message


def test_a_path_that_cannot_run_here_is_skipped_with_its_reason_never_passed():
    calls = []

    def needs_hw(out, x):
        calls.append(x.numel())
        if x.numel() == 3:
            raise Skip("needs fp4 MMA (sm100+); this is cpu")
        out[0].copy_(x * 2)

    cases = [Case("n3", {"n": 3}, dtype=torch.float32),
             Case("n5", {"n": 5}, dtype=torch.float32, skip=lambda dev: f"not on {dev.type}"),
             Case("n7", {"n": 7}, dtype=torch.float32)]
    rows = run_spec(_copy_spec(needs_hw, cases=cases))
    assert [r.outcome for r in rows] == ["skipped", "skipped", "passed"]
    assert rows[0].message == "needs fp4 MMA (sm100+); this is cpu" and rows[1].message == "not on cpu"
    assert calls == [3, 7]  # a case skipped by its predicate makes no inputs and runs nothing
    assert not rows[0].passed and not rows[0].bad
    assert "2 skipped" in format_table(rows) and "SKIPPED" in format_table(rows)
    assert results_json(rows, "cpu")["passed"] is True
    assert results_json(rows[:2], "cpu")["passed"] is False  # all skipped: nothing was shown to pass


def test_cpu_tol_and_dtype_filter():
    def close(out, x):
        out[0].copy_(x * 2 + 1e-3)

    checks = [Check("max_abs", 1e-6, "gpu bound", cpu_tol=1e-2),
              Check("max_abs", 0.0, "only bf16", dtypes=(torch.bfloat16,))]
    rows = run_spec(_copy_spec(close, checks=checks))
    assert len(rows) == 1 and rows[0].passed and rows[0].tol == 1e-2


@interpreter  # the JSON records that it ran under the interpreter
def test_case_results_load_into_the_runner_model():
    from checks.model import CaseResult, from_dict

    def ok(out, x):
        out[0].copy_(x * 2)

    data = results_json(run_spec(_copy_spec(ok)), "cpu")
    json.dumps(data)
    cr = from_dict(CaseResult, data["cases"][0])
    assert cr.outcome == "passed" and cr.name == "copy[n7 float32]::out"
    assert cr.metrics["metric"] == "max_abs" and cr.metrics["tol"] == 0.0
    assert data["device"]["interpreter"] is True and data["passed"] is True


def test_registry_loads_every_op_and_each_has_cpu_cases():
    for op in MY_OPS:
        spec = load_spec(op)
        assert spec.op == op
        assert any("cpu" in c.devices for c in spec.cases)
        assert any("cuda" in c.devices and "cpu" not in c.devices for c in spec.cases), "needs a full-size GPU case"
        assert all(c.why for c in spec.checks)
    with pytest.raises(KeyError, match="known ops"):
        load_spec("no_such_op")
    assert set(MY_OPS) <= set(OPS)


def test_arch_selection_is_keyed_on_compute_capability():
    assert capability("cpu") is None and interpreting() == (KERNEL_DEVICE == "cpu")
    assert fp8_hw_cast((9, 0)) and fp8_hw_cast((12, 0)) and fp8_hw_cast((10, 0)) and fp8_hw_cast((8, 9))
    assert not fp8_hw_cast((8, 0)) and not fp8_hw_cast((8, 6)) and not fp8_hw_cast(None)


@interpreter  # --device cpu in this process
def test_cli_parity_writes_json_and_exits_zero(tmp_path):
    from bot.cli import main

    out = tmp_path / "parity.json"
    assert main(["kernels", "parity", "--op", "rmsnorm", "--case", "3x1000", "--device", "cpu", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [c["name"] for c in data["cases"]] == ["rmsnorm[3x1000 bfloat16]::out"]
    assert main(["kernels", "parity", "--op", "nope"]) == 2


def test_cli_module_is_import_light():
    code = "import sys, kernels.cli; bad = {'torch', 'triton'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_row_without_value_prints():
    r = Row(op="x", case="c", dtype="-", output="-", metric="-", value=None, tol=None, outcome="error", message="m")
    assert "ERROR" in format_table([r]) and r.to_case_result()["outcome"] == "error"


def test_kernels_run_on_cpu_when_triton_was_imported_first():
    code = ("import triton, triton.language as tl, torch\n"
            "import kernels.rmsnorm as r\n"
            "x = torch.randn(3, 64)\n"
            "torch.testing.assert_close(r.rmsnorm(x, torch.ones(64), 1e-6), r.rmsnorm_ref(x, torch.ones(64), 1e-6))\n")
    # no TRITON_INTERPRET, and no visible GPU even where the machine has one: the package turns it on
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=str(__import__("pathlib").Path(__file__).parents[2]))
