"""RecordIO, the framing of the Mesos v1 event stream: ``<length in bytes>\\n<record>``."""

from __future__ import annotations

from typing import Any

import orjson


def encode(record: bytes) -> bytes:
    """One framed record."""
    return b"%d\n%s" % (len(record), record)


def encode_event(event: dict[str, Any]) -> bytes:
    """A framed JSON event, compact as the real master writes it."""
    return encode(orjson.dumps(event))


class Decoder:
    """Incremental decoder: feed bytes as they arrive, get the complete records."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The records completed by ``data``; raises ValueError on a malformed length."""
        self._buf += data
        out: list[bytes] = []
        while True:
            newline = self._buf.find(b"\n")
            if newline < 0:
                if len(self._buf) > 20:
                    raise ValueError(f"RecordIO: no length line in {self._buf[:20]!r}")
                return out
            head = self._buf[:newline]
            if not head.isdigit():
                raise ValueError(f"RecordIO: bad length {head[:20]!r}")
            size = int(head)
            end = newline + 1 + size
            if len(self._buf) < end:
                return out
            out.append(self._buf[newline + 1 : end])
            self._buf = self._buf[end:]
