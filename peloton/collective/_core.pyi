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
        local_rank: int = 0,
        local_size: int = 1,
        cross_rank: int = -1,
        cross_size: int = -1,
        generation: int = 0,
        secret: str = "",
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

NCCL_HEADERS: bool

def nccl_available() -> tuple[bool, str]: ...
def nccl_unique_id() -> bytes: ...
def end_generation(generation: int) -> None: ...
def refused_connections() -> int: ...

class NcclComm:
    def __init__(
        self, unique_id: bytes, rank: int, size: int, device: int, timeout: float
    ) -> None: ...
    def allreduce(
        self, name: str, inp: int, out: int, count: int, dtype: int, op: int, stream: int
    ) -> None: ...
    def broadcast(
        self, name: str, inp: int, out: int, count: int, dtype: int, root: int, stream: int
    ) -> None: ...
    def allgather(
        self, name: str, inp: int, out: int, count: int, dtype: int, stream: int
    ) -> None: ...
    def abort(self) -> None: ...
