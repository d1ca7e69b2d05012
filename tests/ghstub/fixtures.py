"""pytest fixtures for the GitHub stand-in.

Import them into a conftest: ``from tests.ghstub.fixtures import ghstub``.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.ghstub.server import start_stub
from tests.ghstub.state import StubState

# operation id -> requests validated, over the whole test session (printed in the terminal summary)
SESSION_VALIDATED: Counter = Counter()


def assert_kept_contract(state: StubState) -> None:
    """Fail when a request the client sent, or an answer the stand-in gave, broke GitHub's REST contract."""
    with state.lock:
        broken = list(state.violations)
        SESSION_VALIDATED.update(state.validated)
    if broken:
        shown = "\n  ".join(str(v) for v in broken[:20])
        more = f"\n  ... and {len(broken) - 20} more" if len(broken) > 20 else ""
        pytest.fail(f"{len(broken)} GitHub REST contract violation(s):\n  {shown}{more}", pytrace=False)


@pytest.fixture
def ghstub():
    """A running stand-in: ``(base_url, state)``; stopped after the test, which fails on contract violations."""
    base_url, state, stop = start_stub()
    try:
        yield base_url, state
    finally:
        stop()
    assert_kept_contract(state)
