"""Waiting for something to happen in a test, never for time to pass.

A test that sleeps and then asserts progress fails when the machine is busy; a test that compares
elapsed seconds with a constant too. ``wait_until`` polls a condition and returns as soon as it
holds; its only limit is a hang guard (minutes), so a loaded machine makes the test slower, never red.
What bounds a test's time is asserted by counting (connections, requests, executions), not by seconds.
"""

from __future__ import annotations

import os
import time
from typing import Callable, TypeVar, Union

import pytest

T = TypeVar("T")

# Only a hang guard: how long before a condition that should come is taken as never coming.
HANG_GUARD_S = float(os.environ.get("VITDEPLOY_TEST_HANG_GUARD_S", "300"))


def wait_until(condition: Callable[[], T], what: Union[str, Callable[[], str]], poll_s: float = 0.05, limit_s: float = HANG_GUARD_S) -> T:
    """Poll ``condition`` until it returns something true and return that; fail after the hang guard.
    ``what`` names the awaited event (a callable: evaluated at failure, to report the last state seen)."""
    deadline = time.monotonic() + limit_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what() if callable(what) else what} did not happen within {limit_s:.0f} s (a hang guard, not a timing assertion)", pytrace=False)
        time.sleep(poll_s)
