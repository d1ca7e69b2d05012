"""pytest fixtures for the GitHub stand-in.

Import them into a conftest: ``from tests.ghstub.fixtures import ghstub``.
"""

from __future__ import annotations

import pytest

from tests.ghstub.server import start_stub


@pytest.fixture
def ghstub():
    """A running stand-in: ``(base_url, state)``; stopped after the test."""
    base_url, state, stop = start_stub()
    try:
        yield base_url, state
    finally:
        stop()
