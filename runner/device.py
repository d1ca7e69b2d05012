"""What this machine is, and whether it can run a suite's runner label and ``requires``.

Kept free of hard dependencies: it must work on a CPU-only box without torch,
and on a bare GPU image where only torch and triton are installed. nvidia-smi
is asked first because it is cheap; torch is the fallback when it is missing.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from importlib import metadata

_LABEL = re.compile(r"sm(\d+)([a-z]?)")
_REQUIRES = re.compile(r"\s*cc\s*(>=|<=|==|>|<)\s*(\d+)(?:\.(\d+))?\s*")


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: tuple[int, int]
    driver: str | None = None
    cuda: str | None = None


def parse_capability(text: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """'9.0' / '12' / (9, 0) → (9, 0); None stays None."""
    if text is None:
        return None
    if isinstance(text, tuple):
        return (int(text[0]), int(text[1]))
    m = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?\s*", str(text))
    if not m:
        raise ValueError(f"cannot read compute capability '{text}'; write it as MAJOR.MINOR, e.g. 9.0")
    return (int(m.group(1)), int(m.group(2) or 0))


def label_major(label: str) -> int | None:
    """sm90 → 9, sm100 → 10, sm120 → 12, sm89 → 8; cpu → None."""
    m = _LABEL.fullmatch(label)
    if not m:
        return None
    return int(m.group(1)) // 10


def label_for(capability: tuple[int, int] | None) -> str:
    """The runner label a device answers to: (9, 0) → sm90, (12, 0) → sm120, no GPU → cpu."""
    if capability is None:
        return "cpu"
    return f"sm{capability[0]}{capability[1]}" if capability[1] else f"sm{capability[0]}0"


def label_unmet(label: str, capability: tuple[int, int] | None, gpu_name: str | None = None) -> str | None:
    """Why this machine cannot serve ``label``, or None when it can.

    Labels name a GPU family by major compute capability: sm90 is any 9.x
    (H100/H200/H20), sm100 any 10.x, sm120 any 12.x. ``cpu`` runs anywhere.
    """
    if label == "cpu":
        return None
    major = label_major(label)
    if major is None:
        return f"unknown runner label '{label}'"
    if capability is None:
        return f"needs {label}"
    if capability[0] != major:
        here = f"{label_for(capability)}" + (f" ({gpu_name})" if gpu_name else "")
        return f"needs {label}; this machine is {here}"
    return None


def requires_unmet(requires: str | None, capability: tuple[int, int] | None) -> str | None:
    """Why ``requires`` (e.g. 'cc >= 12.0') is not satisfied here, or None when it is."""
    if not requires:
        return None
    m = _REQUIRES.fullmatch(requires)
    if not m:
        return f"cannot read requirement '{requires}' (write e.g. 'cc >= 12.0')"
    op, major, minor = m.group(1), int(m.group(2)), int(m.group(3) or 0)
    if capability is None:
        return f"needs {requires.strip()}; no GPU here"
    want = (major, minor)
    ok = {
        ">=": capability >= want,
        "<=": capability <= want,
        "==": capability == want,
        ">": capability > want,
        "<": capability < want,
    }[op]
    return None if ok else f"needs {requires.strip()}; this machine has cc {capability[0]}.{capability[1]}"


# --------------------------------------------------------------------------- detection


def _nvidia_smi(timeout: float = 10.0) -> Gpu | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    first = out.stdout.strip().splitlines()[0]
    parts = [p.strip() for p in first.split(",")]
    if len(parts) < 3:
        return None
    try:
        cap = parse_capability(parts[1])
    except ValueError:
        return None
    if cap is None:
        return None
    cuda = None
    try:
        banner = subprocess.run([exe], capture_output=True, text=True, timeout=timeout).stdout
        m = re.search(r"CUDA Version:\s*([\d.]+)", banner)
        cuda = m.group(1) if m else None
    except (OSError, subprocess.TimeoutExpired):
        pass
    return Gpu(name=parts[0], capability=cap, driver=parts[2] or None, cuda=cuda)


# Device nodes a GPU runtime needs: CUDA on Linux (/dev/nvidia*), CUDA on WSL2 (/dev/dxg), ROCm (/dev/kfd).
_GPU_NODES = ("nvidia*", "dxg", "kfd")


def has_gpu_node(dev: str = "/dev") -> bool:
    """False only on Linux with no GPU device node: torch could not see a GPU there either, and importing
    it just to be told so costs a second or more of every audit that has nothing to run here."""
    if platform.system() != "Linux":
        return True
    return any(glob.glob(os.path.join(dev, pattern)) for pattern in _GPU_NODES)


def _torch_gpu() -> Gpu | None:
    if not has_gpu_node():
        return None
    try:
        import torch
    except Exception:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        cap = torch.cuda.get_device_capability(0)
        return Gpu(name=torch.cuda.get_device_name(0), capability=(int(cap[0]), int(cap[1])), cuda=torch.version.cuda)
    except Exception:
        return None


def detect_gpu() -> Gpu | None:
    """The first visible GPU, from nvidia-smi or else torch; None on a CPU-only machine."""
    return _nvidia_smi() or _torch_gpu()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def fingerprint(label: str | None = None, gpu: Gpu | None | bool = True):
    """A DeviceFingerprint of this machine. ``gpu=True`` detects; pass a Gpu or None to skip detection."""
    from runner.compat import model

    found = detect_gpu() if gpu is True else (gpu or None)
    return model().DeviceFingerprint(
        label=label or label_for(found.capability if found else None),
        host=socket.gethostname(),
        gpu=found.name if found else None,
        compute_capability=f"{found.capability[0]}.{found.capability[1]}" if found else None,
        driver=found.driver if found else None,
        cuda=found.cuda if found else None,
        torch=_version("torch"),
        triton=_version("triton"),
        python=platform.python_version(),
    )

