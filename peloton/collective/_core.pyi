"""Type stub of the C++ extension peloton.collective._core (see csrc/module.cc)."""

class CollectiveError(RuntimeError):
    """A collective failed: mismatch across ranks, a dead rank, a stall past the timeout."""

class Gathered:
    """An allgather result; supports the buffer protocol (bytes in rank order)."""

    @property
    def dim0s(self) -> list[int]: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class Runtime:
    def __init__(
        self,
        rank: int,
        size: int,
        hosts: list[str],
        ports: list[int],
        timeout: float,
        fusion_threshold: int,
    ) -> None: ...
    def enqueue(
        self,
        kind: int,
        name: str,
        dtype: int,
        op: int,
        root: int,
        shape: list[int],
        inp: int,
        out: int,
        nbytes: int,
    ) -> int: ...
    def poll(self, handle: int) -> bool: ...
    def wait(self, handle: int) -> Gathered | None: ...
    def shutdown(self) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
