"""Runner labels and compute-capability requirements, and fingerprinting with and without a GPU."""

from __future__ import annotations

import os
import stat

import pytest

from runner import device

FAKE_SMI = '''#!/bin/sh
if [ "$1" = "--query-gpu=name,compute_cap,driver_version" ]; then
  echo "NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 575.57.08"
  echo "NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 575.57.08"
  exit 0
fi
echo "| NVIDIA-SMI 575.57.08    Driver Version: 575.57.08    CUDA Version: 12.9     |"
'''


@pytest.mark.parametrize("label,cap,unmet", [
    ("cpu", None, None),
    ("cpu", (9, 0), None),
    ("sm90", (9, 0), None),
    ("sm90a", (9, 0), None),
    ("sm90", None, "needs sm90"),
    ("sm90", (12, 0), "needs sm90; this machine is sm120"),
    ("sm120", (12, 0), None),
    ("sm120", (12, 1), None),
    ("sm120", (10, 0), "needs sm120; this machine is sm100"),
    ("sm100", (10, 0), None),
    ("sm89", (8, 9), None),
    ("gpu", (9, 0), "unknown runner label 'gpu'"),
])
def test_label_satisfaction(label, cap, unmet):
    assert device.label_unmet(label, cap) == unmet


@pytest.mark.parametrize("req,cap,unmet", [
    (None, None, None),
    ("cc >= 12.0", (12, 0), None),
    ("cc >= 12.0", (9, 0), "needs cc >= 12.0; this machine has cc 9.0"),
    ("cc >= 12.0", None, "needs cc >= 12.0; no GPU here"),
    ("cc<10", (9, 0), None),
    ("cc == 9.0", (9, 0), None),
    ("cc > 9", (9, 0), "needs cc > 9; this machine has cc 9.0"),
    ("sm >= 90", (9, 0), "cannot read requirement 'sm >= 90' (write e.g. 'cc >= 12.0')"),
])
def test_requires(req, cap, unmet):
    assert device.requires_unmet(req, cap) == unmet


def test_capability_and_label_names():
    assert device.parse_capability("9.0") == (9, 0)
    assert device.parse_capability("12") == (12, 0)
    assert device.label_for((9, 0)) == "sm90" and device.label_for((12, 0)) == "sm120"
    assert device.label_for((8, 9)) == "sm89" and device.label_for(None) == "cpu"
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        device.parse_capability("hopper")


def test_fingerprint_reads_nvidia_smi(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    fp = device.fingerprint("sm120")
    assert (fp.label, fp.gpu, fp.compute_capability, fp.driver, fp.cuda) == (
        "sm120", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0", "575.57.08", "12.9")
    assert fp.torch and fp.triton and fp.python


def test_fingerprint_without_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi; this CPU box's torch has no CUDA
    fp = device.fingerprint(gpu=None)
    assert (fp.label, fp.gpu, fp.compute_capability, fp.driver) == ("cpu", None, None, None)
    assert fp.host
