"""The testing kit: test distributed code with pytest under ``mpiexec``.

* ``pytest --hpc-c10d`` (the plugin, ``pytest_plugin.py``): one verdict per test across ranks, a
  time limit per test with a "who is where" report, fixtures and a ``world_size`` marker;
* ``assert_same_on_ranks(value)``: every rank holds the same array or object;
* ``run_at_world_size(n, func, ...)``: run a function on n ranks from a serial process.

See docs/testing_your_code.md.
"""

from .same import assert_same_on_ranks
from .spawn import run_at_world_size
from .time_limit import TimeLimitExceeded

__all__ = ["assert_same_on_ranks", "run_at_world_size", "TimeLimitExceeded"]
