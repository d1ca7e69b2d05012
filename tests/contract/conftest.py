"""The GitHub stand-in, contract-checked: a test fails when its requests or the stand-in's answers break it."""

from tests.ghstub.fixtures import ghstub  # noqa: F401  (fixture)
