"""Guards in front of the endpoints that cost CPU or memory.

- :class:`ClientLimiter`: per client (its API token, else its address) at most
  ``client_max_concurrent`` requests in flight and ``client_rate_per_s``
  requests per second (a token bucket of ``client_burst``); over either, 429
  with ``Retry-After``.
- :class:`BodyBudget`: the request body bytes all clients together may hold
  at once (``max_inflight_body_bytes``); over it, 503 with ``Retry-After``.
  Decoding JSON costs ~10-20x its bytes in Python objects, so this is what
  bounds the service's memory under many large requests.
- :func:`scan_json`: nesting depth, longest string and token count of a JSON
  text, found with numpy over its bytes (no Python object per value, mostly
  without the GIL) before the text is decoded.

>>> scan_json(b'{"a": [1, 2, {"b": "xyz"}]}')
JsonShape(depth=3, longest_string=3, tokens=8)
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

import numpy as np

from mtf_core.errors import MtfError


class LimitExceeded(MtfError, ValueError):
    """A client or the service is over a limit; ``status`` is 429 or 503."""

    def __init__(self, message: str, status: int, retry_after_s: float) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s

    @property
    def retry_after(self) -> str:
        return str(max(1, math.ceil(self.retry_after_s)))


class _Bucket:
    __slots__ = ("tokens", "stamp", "inflight")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp
        self.inflight = 0


class ClientLimiter:
    """Concurrency and rate per client key; thread-safe.

    >>> lim = ClientLimiter(max_concurrent=1, rate_per_s=0, burst=1)
    >>> lim.acquire("a")
    >>> try:
    ...     lim.acquire("a")
    ... except LimitExceeded as e:
    ...     print(e.status)
    429
    >>> lim.release("a"); lim.acquire("a")
    """

    #: Idle clients are forgotten once this many are tracked.
    MAX_CLIENTS = 10_000

    def __init__(self, max_concurrent: int, rate_per_s: float, burst: int) -> None:
        self.max_concurrent = max_concurrent
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clients: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def acquire(self, key: str) -> None:
        """Takes one request slot for ``key`` or raises LimitExceeded (429)."""
        now = time.monotonic()
        with self._lock:
            b = self._clients.get(key)
            if b is None:
                if len(self._clients) >= self.MAX_CLIENTS:
                    self._forget_idle()
                b = self._clients[key] = _Bucket(float(self.burst), now)
            if b.inflight >= self.max_concurrent:
                raise LimitExceeded(
                    f"this client has {b.inflight} requests in flight; at most "
                    f"{self.max_concurrent} are allowed (client_max_concurrent)",
                    429,
                    1.0,
                )
            if self.rate_per_s > 0:
                b.tokens = min(
                    float(self.burst), b.tokens + (now - b.stamp) * self.rate_per_s
                )
                b.stamp = now
                if b.tokens < 1.0:
                    raise LimitExceeded(
                        f"this client sent more than {self.rate_per_s:g} requests "
                        "per second (client_rate_per_s)",
                        429,
                        (1.0 - b.tokens) / self.rate_per_s,
                    )
                b.tokens -= 1.0
            b.inflight += 1

    def release(self, key: str) -> None:
        with self._lock:
            b = self._clients.get(key)
            if b is not None and b.inflight > 0:
                b.inflight -= 1

    def _forget_idle(self) -> None:
        for key in [k for k, b in self._clients.items() if b.inflight == 0]:
            del self._clients[key]


class BodyBudget:
    """Request body bytes in flight across all clients; thread-safe.

    One request may always take the whole budget, so that a body of
    ``max_body_bytes`` is served when it is alone.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return self._used

    def reserve(self, nbytes: int) -> int:
        """Reserves ``nbytes`` (capped at the budget) or raises LimitExceeded
        (503); returns what was reserved, to :meth:`release` later."""
        n = min(max(nbytes, 0), self.max_bytes)
        with self._lock:
            if self._used + n > self.max_bytes:
                raise LimitExceeded(
                    f"the service holds {self._used} bytes of other requests' "
                    f"bodies (max_inflight_body_bytes={self.max_bytes}); retry",
                    503,
                    1.0,
                )
            self._used += n
        return n

    def release(self, nbytes: int) -> None:
        with self._lock:
            self._used = max(0, self._used - nbytes)


@dataclass(frozen=True)
class JsonShape:
    """What :func:`scan_json` found: the deepest nesting of arrays and objects,
    the longest string's length in bytes (escapes included), and the count of
    strings, brackets and commas (about one per decoded value)."""

    depth: int
    longest_string: int
    tokens: int


_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPENERS, _CLOSERS, _COMMA = (ord("["), ord("{")), (ord("]"), ord("}")), ord(",")


def scan_json(raw: bytes) -> JsonShape:
    """The shape of a JSON text, without decoding it: numpy over its bytes
    (about 30 ms for 6 MB, mostly without the GIL).  Malformed text gives
    some shape; the decoder reports the syntax error afterwards."""
    b = np.frombuffer(raw, dtype=np.uint8)
    if b.size == 0:
        return JsonShape(0, 0, 0)
    quotes = np.flatnonzero(b == _QUOTE)
    if b"\\" in raw:
        # A quote is escaped when an odd number of backslashes precede it.
        idx = np.arange(b.size, dtype=np.int64)
        last_not_bs = np.maximum.accumulate(np.where(b != _BACKSLASH, idx, -1))
        before = quotes - 1
        run = np.where(before >= 0, before - last_not_bs[np.maximum(before, 0)], 0)
        real = quotes[run % 2 == 0]
    else:  # the usual body: no escapes at all
        real = quotes
    # Real quotes alternate: opening, closing, ...; bytes from an opening
    # quote up to its closing one are inside a string.
    toggles = np.zeros(b.size, dtype=np.uint8)
    toggles[real] = 1
    inside = np.bitwise_xor.accumulate(toggles).astype(bool) | (toggles == 1)
    outside = ~inside
    opens = outside & ((b == _OPENERS[0]) | (b == _OPENERS[1]))
    closes = outside & ((b == _CLOSERS[0]) | (b == _CLOSERS[1]))
    level = np.cumsum(opens.astype(np.int32) - closes.astype(np.int32))
    starts, ends = real[0::2], real[1::2]
    n = min(starts.size, ends.size)
    longest = int((ends[:n] - starts[:n]).max()) - 1 if n else 0
    return JsonShape(
        depth=max(int(level.max()), 0),
        longest_string=longest,
        tokens=int(real.size // 2)
        + int(np.count_nonzero(opens))
        + int(np.count_nonzero(outside & (b == _COMMA))),
    )
