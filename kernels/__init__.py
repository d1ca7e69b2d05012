"""Triton kernels, each beside its torch reference, with parity specs and benchmarks.

Triton decides at ``@triton.jit`` time whether to interpret, so on a machine with no NVIDIA device (or
with every device hidden by ``CUDA_VISIBLE_DEVICES=""``) the package turns the interpreter on before any
kernel module is imported; an explicit ``TRITON_INTERPRET`` always wins. If something imported ``triton.language`` earlier (torch.compile, another library), its
library functions (``tl.max``, ``tl.sum``, …) were built for compilation; they are rewrapped for the
interpreter so the kernels still run on CPU whatever the import order.
"""

import os as _os
import sys as _sys

_no_gpu = not _os.path.exists("/dev/nvidiactl") or _os.environ.get("CUDA_VISIBLE_DEVICES") == ""
if "TRITON_INTERPRET" not in _os.environ and _no_gpu:
    _os.environ["TRITON_INTERPRET"] = "1"
    if "triton.language" in _sys.modules:
        from kernels._interp import rewrap_language as _rewrap

        _rewrap()
