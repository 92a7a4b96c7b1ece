"""The suite's own rules about time (issue 36): no test may fail because the machine is busy.

- The wall clock is read only where a limit is a hang guard (tests/waiting.py and one thread in
  tests/test_remote.py), where it stamps cache entries (tests/artifact_cache.py), or where a benchmark
  compares two timings taken side by side (tests/test_torch_modes.py, slow); any other reading of it in
  a test is a wall-clock assertion in the making.
- The fast tier's CPU-time guard allows more under load, within a bound (tests/conftest.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import CONTENTION_FACTOR_MAX, contention_factor

TESTS = Path(__file__).resolve().parent
WALL_CLOCK = re.compile(r"\btime\.(time|monotonic|perf_counter)(_ns)?\(|\bdatetime\.(now|utcnow)\(")
ALLOWED = {
    "waiting.py": "the hang guard of wait_until",
    "test_remote.py": "the hang guard of a watcher thread (wait_until cannot fail a test from a thread)",
    "artifact_cache.py": "build stamps and the age of cache entries, never asserted",
    "test_torch_modes.py": "a slow benchmark: the profiled cell against a bare loop timed beside it, a ratio",
}


def test_only_hang_guards_and_side_by_side_benchmarks_read_the_wall_clock():
    readers = {p.name for p in TESTS.glob("*.py") if WALL_CLOCK.search(p.read_text())}
    assert readers - set(ALLOWED) == set(), f"tests reading the wall clock (wait for an event or count instead): {readers - set(ALLOWED)}"
    assert set(ALLOWED) - readers == set(), f"no longer reading the wall clock, drop from ALLOWED: {set(ALLOWED) - readers}"


def test_no_sleep_is_followed_by_an_assertion_on_progress():
    """`time.sleep(...)` then `assert` on the next statement is the pattern that fails under load."""
    found = []
    for path in TESTS.glob("*.py"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines[:-1]):
            if re.match(r"\s*time\.sleep\(", line) and lines[i + 1].strip().startswith("assert"):
                found.append(f"{path.name}:{i + 1}")
    assert found == [], found


@pytest.mark.parametrize("load_per_core, factor", [(0.0, 1.0), (1.0, 1.0), (1.5, 1.25), (2.0, CONTENTION_FACTOR_MAX), (8.0, CONTENTION_FACTOR_MAX)])
def test_the_cpu_guard_grows_with_load_within_a_bound(load_per_core, factor):
    assert contention_factor(load_per_core) == pytest.approx(factor)
    assert CONTENTION_FACTOR_MAX <= 1.5  # a 10 s test still fails the 5 s fast tier at any load
