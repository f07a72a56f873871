"""Answers built once and shared: every open page refetches the cluster after each change, so
each answer is built once per change (and per what its callers may view), encoded once, and
compressed once."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

# How long an answer is reused while nothing is known to have changed: changes that reach no
# event of this daemon (what another daemon wrote) show within this long.
MAX_AGE_SECONDS = 1.0
# Answers kept (one per route and what its callers may view).
ENTRIES = 64
# Shorter answers are not worth compressing.
GZIP_FROM_BYTES = 1024


class Encoded:
    """A JSON answer's bytes, and their gzip (made on first use, once)."""

    def __init__(self, body: Any) -> None:
        self.plain = json.dumps(body, separators=(",", ":")).encode()
        self._gzip: bytes | None = None
        self._lock = threading.Lock()

    def gzipped(self) -> bytes | None:
        """The gzip of :attr:`plain`; None for an answer too short to be worth it."""
        if len(self.plain) < GZIP_FROM_BYTES:
            return None
        with self._lock:
            if self._gzip is None:
                # Level 1: the JSON is repetitive (ten times smaller already), and this is paid
                # once per change.
                self._gzip = gzip.compress(self.plain, compresslevel=1, mtime=0)
            return self._gzip


@dataclass
class _Entry:
    generation: int
    made: float
    answer: Encoded | None = None
    building: threading.Lock = field(default_factory=threading.Lock)


class AnswerCache:
    """Answers by key, reused until ``generation()`` moves (something changed) or they are
    MAX_AGE_SECONDS old; callers asking for one being built wait for it. Thread-safe."""

    def __init__(
        self,
        generation: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
        max_age: float = MAX_AGE_SECONDS,
    ) -> None:
        self._generation = generation
        self._clock = clock
        self._max_age = max_age
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Any]) -> Encoded:
        """The answer for ``key``: a fresh one kept, or ``build()``'s, encoded."""
        generation = self._generation()  # read first: a change during the build is not missed
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not self._fresh(entry, generation):
                entry = self._entries[key] = _Entry(generation, self._clock())
            self._entries.move_to_end(key)
            while len(self._entries) > ENTRIES:
                self._entries.popitem(last=False)
        with entry.building:
            if entry.answer is None:
                entry.answer = Encoded(build())
                entry.made = self._clock()
            return entry.answer

    def _fresh(self, entry: _Entry, generation: int) -> bool:
        return entry.generation == generation and self._clock() - entry.made < self._max_age
