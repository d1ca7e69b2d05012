"""The GitHub stand-in, contract-checked: a test fails when its requests or the stand-in's answers break it."""

from tests.ghstub.contract import contract
from tests.ghstub.fixtures import (
    SESSION_VALIDATED,
    ghstub,  # noqa: F401  (fixture)
)


def pytest_terminal_summary(terminalreporter) -> None:
    """How much of GitHub's REST contract this run exercised (every ``ghstub`` test in the run counts)."""
    if not SESSION_VALIDATED:
        return
    every = {op.id for op in contract().operations}
    seen = set(SESSION_VALIDATED) & every
    terminalreporter.write_line(
        f"GitHub REST contract: {len(seen)} of {len(every)} operations validated, "
        f"{sum(SESSION_VALIDATED.values())} requests and answers checked"
    )
