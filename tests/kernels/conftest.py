"""Kernel tests run on the device this process's kernels run on; interpreter-only ones run where it is on
(see ``tests/kernels/interpreter.py``)."""

from __future__ import annotations

import pytest

from tests.kernels.interpreter import KERNEL_DEVICE, configure, group, pyfunc_call


def pytest_configure(config):
    configure(config)


def pytest_collection_modifyitems(config, items):
    group(items)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    return pyfunc_call(pyfuncitem)


@pytest.fixture
def device() -> str:
    """Where this process's Triton kernels run: ``cuda`` where they compile, else ``cpu`` (interpreter)."""
    return KERNEL_DEVICE
