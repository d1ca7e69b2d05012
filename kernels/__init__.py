"""Triton kernels, each beside its torch reference, with parity specs and benchmarks.

Triton decides at ``@triton.jit`` time whether to interpret, so on a machine with no NVIDIA device the
package turns the interpreter on before any kernel module is imported; an explicit ``TRITON_INTERPRET``
always wins.
"""

import os as _os

if "TRITON_INTERPRET" not in _os.environ and not _os.path.exists("/dev/nvidiactl"):
    _os.environ["TRITON_INTERPRET"] = "1"
