from tests.ghstub.fixtures import ghstub  # noqa: F401  (fixture)
