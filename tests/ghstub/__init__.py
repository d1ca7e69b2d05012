"""A GitHub REST stand-in served over loopback, for the real PyGithub client.

``start_stub()`` returns ``(base_url, state, stop)``; ``state`` is a plain
``StubState`` tests seed and inspect. See ``docs/bot.md`` for the endpoints.
"""

from tests.ghstub.server import start_stub
from tests.ghstub.state import Fault, StubState

__all__ = ["start_stub", "StubState", "Fault"]
