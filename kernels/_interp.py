"""Late switch to the Triton interpreter: rewrap ``triton.language``'s jit-defined library functions."""

from __future__ import annotations

import warnings


def rewrap_language() -> int:
    """Replace compiled-mode ``JITFunction`` objects in ``triton.language`` (and its ``standard``/``math``
    modules) by interpreter functions; returns how many were replaced. Warns instead of failing when
    Triton's internals differ, since only CPU runs need this."""
    try:
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError as exc:  # pragma: no cover - depends on the Triton build
        warnings.warn(f"kernels: cannot switch Triton to its interpreter late ({exc}); import kernels before triton",
                      stacklevel=2)
        return 0
    n = 0
    for mod in {tl, getattr(tl, "standard", tl), getattr(tl, "math", tl)}:
        for name, obj in list(vars(mod).items()):
            if isinstance(obj, JITFunction):
                setattr(mod, name, InterpretedFunction(obj.fn))
                n += 1
    return n
