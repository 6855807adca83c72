"""The OpenAI-compatible HTTP server: Quart routes (app), wire protocol (protocol), the engine on
its own thread (async_engine) and Prometheus metrics (metrics). Start it with `python -m minillm.serve`.

Test-only hooks, off unless their environment variable is set when the server starts:
  MINILLM_TEST_FAULTS=1          adds POST /_test/fault {"after_steps": N}: the engine loop raises
                                 RuntimeError after N more steps (0: the next step), to exercise the
                                 fault path (traceback logged, error event on open streams, 503).
  MINILLM_TEST_STEP_DELAY=SEC    sleeps SEC after every engine step, so tests can catch requests
                                 mid-flight (disconnects, faults, shutdown drain) on a tiny fast model.
"""

from minillm.server.app import build_app
from minillm.server.async_engine import AsyncEngine

__all__ = ["AsyncEngine", "build_app"]
