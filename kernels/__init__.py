"""Triton kernels, each beside its torch reference, with parity specs and benchmarks."""
