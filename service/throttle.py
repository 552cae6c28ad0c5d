"""Throttling of failed authentication: per client address, a sliding window of failures."""

from __future__ import annotations

import time
from collections import OrderedDict, deque

__all__ = ["AuthThrottle"]

_MAX_ADDRESSES = 100_000  # addresses remembered at most (the oldest forgotten first): bounded memory


class AuthThrottle:
    """At most ``failures`` failed authentications per ``window_s`` seconds from one address.

    Past that, every authenticated request from the address is refused (429)
    until its oldest failure leaves the window, the right key included: a
    guesser must not learn that a guess was right.
    """

    def __init__(self, failures: int, window_s: int, clock=time.monotonic):
        self.failures = failures
        self.window_s = window_s
        self._clock = clock
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str) -> deque[float] | None:
        times = self._seen.get(address)
        if times is None:
            return None
        cutoff = self._clock() - self.window_s
        while times and times[0] <= cutoff:
            times.popleft()
        if not times:
            del self._seen[address]
            return None
        return times

    def retry_after_s(self, address: str) -> int | None:
        """Seconds until ``address`` may try again; None when it is not throttled."""
        times = self._recent(address)
        if times is None or len(times) < self.failures:
            return None
        return max(1, int(times[0] + self.window_s - self._clock()) + 1)

    def failed(self, address: str) -> None:
        """Count one failed authentication from ``address``."""
        times = self._recent(address)
        if times is None:
            times = self._seen[address] = deque()
        self._seen.move_to_end(address)
        times.append(self._clock())
        while len(self._seen) > _MAX_ADDRESSES:
            self._seen.popitem(last=False)
