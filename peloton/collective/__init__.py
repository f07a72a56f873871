"""peloton's collective runtime: ring allreduce and friends for data-parallel training.

Every rank of a gang runs the same script::

    import numpy as np
    import peloton.collective as pc

    pc.init()                                   # from PELOTON_RANK, PELOTON_PEERS, ...
                                                # (peloton.core.gangenv)
    grad = np.ones(1000, dtype=np.float32)
    mean = pc.allreduce(grad, op="average")     # a new array, the same on every rank
    pc.shutdown()

The work happens in C++ (:mod:`peloton.collective._core`): a background thread negotiates which
named tensors every rank has submitted (rank 0 coordinates, so ranks may submit in any order),
fuses small allreduces into one buffer, and runs bandwidth-optimal ring algorithms over TCP.
A mismatch, a dead rank or a stall past the timeout raises :class:`CollectiveError` on every rank
instead of hanging. NumPy arrays and torch CPU tensors are accepted; torch is imported only by
the caller that passes a tensor.
"""

from __future__ import annotations

import atexit
import ctypes
import enum
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from peloton.collective import _core
from peloton.collective._core import CollectiveError
from peloton.core.gangenv import DEFAULT_TIMEOUT, GangEnv, GangEnvError

__all__ = [
    "Adasum",
    "Average",
    "CollectiveError",
    "Handle",
    "Max",
    "Min",
    "Product",
    "ReduceOp",
    "Sum",
    "allgather",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "barrier",
    "broadcast",
    "broadcast_",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reduce_scatter",
    "refused_connections",
    "rocm_built",
    "shutdown",
    "size",
    "synchronize",
]

T = TypeVar("T")


# Wire codes shared with csrc/common.h.
_KIND = {"allreduce": 0, "allgather": 1, "broadcast": 2, "reduce_scatter": 3, "barrier": 4}
_OPS = {"sum": 0, "average": 1, "min": 2, "max": 3, "product": 4}


class ReduceOp(enum.StrEnum):
    """The reductions under Horovod's names; each equals its string, so ``op="sum"`` still works."""

    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"
    ADASUM = "adasum"  # named so Horovod scripts import; refused with the alternative


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
Adasum = ReduceOp.ADASUM
ADASUM_REFUSED = (
    "op: Adasum is not implemented by peloton's runtime; use op=Average (the default) and scale "
    "the learning rate by size(), as with Horovod's Average"
)
_NUMPY_DTYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int32": 4, "int64": 5}
_TORCH_DTYPES = {
    "torch.float32": 0,
    "torch.float64": 1,
    "torch.float16": 2,
    "torch.bfloat16": 3,
    "torch.int32": 4,
    "torch.int64": 5,
}


_lock = threading.Lock()
_runtime: _core.Runtime | None = None
_topology: GangEnv | None = None
_counters: dict[str, itertools.count[int]] = {}
_timeout = DEFAULT_TIMEOUT
_nccl: _core.NcclComm | None = None


# ---------------------------------------------------------------- init and topology


def init(
    rank: int | None = None,
    size: int | None = None,
    peers: list[str] | str | None = None,
    local_rank: int | None = None,
    local_size: int | None = None,
    timeout: float | None = None,
    fusion_threshold: int | None = None,
    generation: int | None = None,
    *,
    cross_rank: int | None = None,
    cross_size: int | None = None,
) -> None:
    """Connects this rank to its gang; every argument left None comes from PELOTON_* variables.

    Blocks until every rank has connected (or raises after the timeout naming the missing ranks).
    A peer of another ``generation`` is refused at once with an error naming both. With
    ``PELOTON_GANG_SECRET`` set every connection proves the secret both ways: one that does not
    (a stranger on this rank's port) is closed, logged on stderr and counted
    (:func:`refused_connections`), and this rank goes on waiting for its peers.
    """
    global _runtime, _topology, _timeout
    with _lock:
        if _runtime is not None:
            raise CollectiveError(
                "peloton.collective is already initialized; call shutdown() first"
            )
        try:
            topo = GangEnv.from_env(
                os.environ,
                rank=rank,
                size=size,
                peers=peers,
                local_rank=local_rank,
                local_size=local_size,
                cross_rank=cross_rank,
                cross_size=cross_size,
                timeout=timeout,
                fusion_threshold=fusion_threshold,
                generation=generation,
            )
        except GangEnvError as exc:
            raise CollectiveError(str(exc)) from None
        hosts, ports = topo.addresses()
        assert topo.timeout is not None and topo.fusion_threshold is not None
        _runtime = _core.Runtime(
            topo.rank,
            topo.size,
            hosts,
            ports,
            topo.timeout,
            topo.fusion_threshold,
            local_rank=topo.local_rank,
            local_size=topo.local_size,
            cross_rank=topo.cross_rank,
            cross_size=topo.cross_size,
            generation=topo.generation,
            secret=topo.secret,
        )
        _topology = topo
        _timeout = topo.timeout
        _counters.clear()


def shutdown() -> None:
    """Leaves the gang cleanly (waits up to the timeout for the others); no-op if uninitialized."""
    global _runtime, _topology, _nccl
    with _lock:
        rt, _runtime, _topology, _nccl = _runtime, None, None, None
    if rt is not None:
        rt.shutdown()


atexit.register(shutdown)


def refused_connections() -> int:
    """Connections this process's runtime refused so far: no rank of its gang (no or a wrong
    gang secret, a replayed handshake, garbage, or silence past the handshake timeout)."""
    return int(_core.refused_connections())


def is_initialized() -> bool:
    """True between init() and shutdown()."""
    return _runtime is not None


def _topo() -> GangEnv:
    if _topology is None:
        raise CollectiveError("peloton.collective is not initialized: call init() first")
    return _topology


def rank() -> int:
    """This process's rank in the gang, 0 ≤ rank < size."""
    return _topo().rank


def size() -> int:
    """Number of ranks in the gang."""
    return _topo().size


def local_rank() -> int:
    """Rank among the processes on this host (picks the GPU)."""
    return _topo().local_rank


def local_size() -> int:
    """Number of ranks on this host."""
    return _topo().local_size


def cross_rank() -> int:
    """Index of this host among the gang's hosts."""
    return _topo().cross_rank


def cross_size() -> int:
    """Number of hosts in the gang."""
    return _topo().cross_size


def _rt() -> _core.Runtime:
    if _runtime is None:
        raise CollectiveError("peloton.collective is not initialized: call init() first")
    return _runtime


# ---------------------------------------------------------------- tensors


def _is_torch(x: object) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


@dataclass
class _Buf:
    """A contiguous view of the caller's tensor: its address, dtype code, shape and byte size."""

    obj: Any  # the contiguous numpy array or torch tensor the address points into
    addr: int
    dtype: int
    shape: list[int]
    nbytes: int


def _buffer(x: Any, what: str) -> _Buf:
    if _is_torch(x):
        if x.is_cuda:
            raise CollectiveError(f"{what}: CUDA tensors go through NCCL (internal error)")
        code = _TORCH_DTYPES.get(str(x.dtype))
        if code is None:
            raise TypeError(f"{what}: unsupported torch dtype {x.dtype}")
        t = x.contiguous()
        return _Buf(t, int(t.data_ptr()), code, list(t.shape), t.numel() * t.element_size())
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what}: expected a numpy array or torch tensor, got {type(x).__name__}")
    code = _NUMPY_DTYPES.get(x.dtype.name)
    if code is None:
        raise TypeError(f"{what}: unsupported dtype {x.dtype}")
    a = np.ascontiguousarray(x)
    return _Buf(a, int(a.ctypes.data), code, list(a.shape), int(a.nbytes))


def _empty_like(b: _Buf, shape: list[int] | None = None) -> _Buf:
    shape = b.shape if shape is None else shape
    if _is_torch(b.obj):
        t = b.obj.new_empty(shape)
        return _Buf(t, int(t.data_ptr()), b.dtype, shape, t.numel() * t.element_size())
    a = np.empty(shape, dtype=b.obj.dtype)
    return _Buf(a, int(a.ctypes.data), b.dtype, shape, int(a.nbytes))


def _copy_back(dst: Any, src: Any) -> None:
    """Writes a result into the caller's (possibly non-contiguous) tensor."""
    if src is dst:
        return
    if _is_torch(dst):
        dst.copy_(src)
    else:
        np.copyto(dst, src)


def _name(kind: str, name: str | None) -> str:
    if name is not None:
        return str(name)
    # Unnamed tensors get per-kind sequence numbers: every rank must submit them in one order.
    counter = _counters.setdefault(kind, itertools.count())
    return f"{kind}.noname.{next(counter)}"


def _op(op: str) -> int:
    if op == Adasum:
        raise ValueError(ADASUM_REFUSED)
    code = _OPS.get(op)
    if code is None:
        raise ValueError(f"op: unknown reduction {op!r}; use one of {', '.join(_OPS)}")
    return code


class Handle:
    """An operation in flight; pass it to :func:`synchronize` (or :func:`poll`)."""

    def __init__(
        self, rt: _core.Runtime | None, ident: int, finish: Callable[[Any], Any], keep: Any
    ):
        self._rt = rt
        self._id = ident
        self._finish = finish
        self._keep = keep  # the buffers C++ reads and writes, alive until synchronize
        self._result: Any = None
        self._done = False

    @classmethod
    def completed(cls, result: Any) -> Handle:
        """A handle whose operation already finished (the NCCL path runs synchronously)."""
        handle = cls(None, 0, lambda _: result, None)
        handle._result, handle._done = result, True
        return handle

    @classmethod
    def all(cls, parts: Sequence[Handle]) -> Handle:
        """One handle for several operations; its result is the list of their results."""
        return _Group(parts)

    def then(self, fn: Callable[[Any], Any]) -> Handle:
        """Makes the result ``fn(result)`` (applied once, when it is ready); returns self."""
        if self._done:
            self._result = fn(self._result)
        else:
            finish = self._finish
            self._finish = lambda out: fn(finish(out))
        return self

    def poll(self) -> bool:
        """True once the operation completed (successfully or not)."""
        return self._done or (self._rt is not None and bool(self._rt.poll(self._id)))

    def wait(self) -> Any:
        """Blocks until done and returns the result; raises CollectiveError on failure."""
        if not self._done and self._rt is not None:
            try:
                out = self._rt.wait(self._id)
                self._result = self._finish(out)
            finally:
                self._done = True
                self._keep = None
        return self._result


class _Group(Handle):
    """Several handles waited for as one (see :meth:`Handle.all`)."""

    def __init__(self, parts: Sequence[Handle]):
        super().__init__(None, 0, lambda results: results, None)
        self._parts = list(parts)

    def poll(self) -> bool:
        return self._done or all(p.poll() for p in self._parts)

    def wait(self) -> Any:
        if not self._done:
            results: list[Any] = []
            failure: BaseException | None = None
            # Every part is waited for, even after one fails: a name stays taken until then.
            for part in self._parts:
                try:
                    results.append(part.wait())
                except CollectiveError as exc:
                    failure = failure or exc
            self._done = True
            if failure is not None:
                raise failure
            self._result = self._finish(results)
        return self._result


def _submit(
    kind: str,
    name: str,
    src: _Buf,
    out: _Buf | None,
    op: int,
    root: int,
    finish: Callable[[Any], Any],
) -> Handle:
    rt = _rt()
    ident = rt.enqueue(
        _KIND[kind],
        name,
        src.dtype,
        op,
        root,
        src.shape,
        src.addr,
        out.addr if out is not None else 0,
        src.nbytes,
    )
    return Handle(rt, ident, finish, (src, out))


def allreduce_async(x: T, op: str = "average", name: str | None = None) -> Handle:
    """Starts an allreduce of x into a new array/tensor; synchronize(handle) returns it."""
    if _is_cuda(x):
        return Handle.completed(_cuda_allreduce(x, op, _name("allreduce", name), inplace=False))
    src = _buffer(x, "allreduce")
    out = _empty_like(src)
    result = out.obj
    return _submit("allreduce", _name("allreduce", name), src, out, _op(op), 0, lambda _: result)


def allreduce_async_(x: T, op: str = "average", name: str | None = None) -> Handle:
    """Starts an allreduce whose result is written into x; synchronize(handle) returns x."""
    if _is_cuda(x):
        return Handle.completed(_cuda_allreduce(x, op, _name("allreduce", name), inplace=True))
    src = _buffer(x, "allreduce_")

    def finish(_: Any) -> T:
        _copy_back(x, src.obj)
        return x

    return _submit("allreduce", _name("allreduce", name), src, src, _op(op), 0, finish)


def synchronize(handle: Handle) -> Any:
    """Waits for an async operation and returns its result (raises CollectiveError on failure)."""
    return handle.wait()


def poll(handle: Handle) -> bool:
    """True once the async operation has completed."""
    return handle.poll()


def allreduce(x: T, op: str = "average", name: str | None = None) -> T:
    """Reduces x element-wise across ranks (sum, average, min, max, product); returns a new one."""
    result: T = allreduce_async(x, op=op, name=name).wait()
    return result


def allreduce_(x: T, op: str = "average", name: str | None = None) -> T:
    """Like allreduce, but writes the result into x and returns x."""
    result: T = allreduce_async_(x, op, name).wait()
    return result


def allgather(x: T, name: str | None = None) -> T:
    """Concatenates every rank's x along dim 0, in rank order (first dims may differ)."""
    if _is_cuda(x):
        gathered: T = _cuda_allgather(x, _name("allgather", name))
        return gathered
    src = _buffer(x, "allgather")
    if not src.shape:
        raise ValueError("allgather: x must have at least one dimension")

    def finish(gathered: Any) -> Any:
        shape = [int(sum(gathered.dim0s)), *src.shape[1:]]
        raw = np.frombuffer(gathered, dtype=np.uint8)
        if _is_torch(src.obj):
            import torch  # the caller passed a tensor, so torch is there

            return torch.from_numpy(raw.copy()).view(src.obj.dtype).reshape(shape)
        return raw.view(src.obj.dtype).reshape(shape).copy()

    handle = _submit("allgather", _name("allgather", name), src, None, 0, 0, finish)
    result: T = handle.wait()
    return result


def _check_root(root_rank: int) -> int:
    n = size()
    if not 0 <= int(root_rank) < n:
        raise ValueError(f"root_rank: {root_rank} is outside a gang of {n}")
    return int(root_rank)


def broadcast(x: T, root_rank: int, name: str | None = None) -> T:
    """Returns a copy of root_rank's x on every rank."""
    root = _check_root(root_rank)
    if _is_cuda(x):
        copied: T = _cuda_broadcast(x, root, _name("broadcast", name), inplace=False)
        return copied
    src = _buffer(x, "broadcast")
    out = _empty_like(src)
    result = out.obj
    handle = _submit("broadcast", _name("broadcast", name), src, out, 0, root, lambda _: result)
    value: T = handle.wait()
    return value


def broadcast_(x: T, root_rank: int, name: str | None = None) -> T:
    """Overwrites x with root_rank's x; returns x."""
    root = _check_root(root_rank)
    if _is_cuda(x):
        same: T = _cuda_broadcast(x, root, _name("broadcast", name), inplace=True)
        return same
    src = _buffer(x, "broadcast_")

    def finish(_: Any) -> T:
        _copy_back(x, src.obj)
        return x

    value: T = _submit("broadcast", _name("broadcast", name), src, src, 0, root, finish).wait()
    return value


def reduce_scatter(x: T, op: str = "sum", name: str | None = None) -> T:
    """Reduces x across ranks and returns this rank's slice of dim 0.

    Dim 0 is split as evenly as possible in rank order: the first ``dim0 % size`` ranks get one
    row more.
    """
    if _is_cuda(x):
        # NCCL path: a full allreduce, then this rank's rows (correct, not bandwidth-optimal).
        reduced = _cuda_allreduce(x, op, _name("reduce_scatter", name), inplace=False)
        mine: T = reduced.tensor_split(size())[rank()].clone()
        return mine
    src = _buffer(x, "reduce_scatter")
    if not src.shape:
        raise ValueError("reduce_scatter: x must have at least one dimension")
    n, r = size(), rank()
    rows = src.shape[0] // n + (1 if r < src.shape[0] % n else 0)
    out = _empty_like(src, [rows, *src.shape[1:]])
    result = out.obj
    handle = _submit(
        "reduce_scatter", _name("reduce_scatter", name), src, out, _op(op), 0, lambda _: result
    )
    value: T = handle.wait()
    return value


def barrier() -> None:
    """Returns once every rank has entered the barrier."""
    empty = _buffer(np.empty(0, dtype=np.float32), "barrier")
    _submit("barrier", _name("barrier", None), empty, None, 0, 0, lambda _: None).wait()


# ---------------------------------------------------------------- CUDA tensors through NCCL


def _is_cuda(x: object) -> bool:
    return _is_torch(x) and bool(getattr(x, "is_cuda", False))


def _preload_nccl() -> None:
    """Makes libnccl.so.2 from the nvidia-nccl wheel (torch's dependency) visible to dlopen."""
    import ctypes
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        lib = os.path.join(root, "nccl", "lib", "libnccl.so.2")
        if os.path.exists(lib):
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            return


def _nccl_loads() -> tuple[bool, str]:
    """Whether libnccl.so.2 (and libcudart) load, else the loader's reason."""
    ok, why = _core.nccl_available()
    if not ok:
        _preload_nccl()
        ok, why = _core.nccl_available()
    return bool(ok), str(why)


def _nccl_comm(device: int) -> _core.NcclComm:
    """The gang's NCCL communicator, made on first use: rank 0's unique id rides our TCP ring."""
    global _nccl
    if _nccl is None:
        ok, why = _nccl_loads()
        if not ok:
            raise CollectiveError(f"CUDA tensors need NCCL: {why}")
        uid = np.zeros(16, dtype=np.int64)  # 128 bytes, NCCL_UNIQUE_ID_BYTES
        if rank() == 0:
            uid = np.frombuffer(_core.nccl_unique_id(), dtype=np.int64).copy()
        uid = broadcast(uid, 0, name="peloton.nccl.unique_id")
        _nccl = _core.NcclComm(uid.tobytes(), rank(), size(), device, _timeout)
    return _nccl


def _cuda_args(t: Any) -> tuple[_core.NcclComm, int, int]:
    import torch

    code = _TORCH_DTYPES.get(str(t.dtype))
    if code is None:
        raise TypeError(f"unsupported torch dtype {t.dtype}")
    comm = _nccl_comm(int(t.device.index or 0))
    return comm, code, int(torch.cuda.current_stream(t.device).cuda_stream)


def _cuda_allreduce(x: Any, op: str, name: str, inplace: bool) -> Any:
    t = x.contiguous()
    out = t if inplace else t.new_empty(t.shape)
    comm, code, stream = _cuda_args(t)
    comm.allreduce(name, t.data_ptr(), out.data_ptr(), t.numel(), code, _op(op), stream)
    if inplace:
        _copy_back(x, t)
        return x
    return out


def _cuda_broadcast(x: Any, root: int, name: str, inplace: bool) -> Any:
    t = x.contiguous()
    out = t if inplace else (t.clone() if rank() == root else t.new_empty(t.shape))
    comm, code, stream = _cuda_args(t)
    comm.broadcast(name, out.data_ptr(), out.data_ptr(), out.numel(), code, root, stream)
    if inplace:
        _copy_back(x, out)
        return x
    return out


def _cuda_allgather(x: Any, name: str) -> Any:
    """Variable first dims: sizes go over TCP, NCCL moves rows padded to the largest."""
    import torch

    t = x.contiguous()
    if t.dim() == 0:
        raise ValueError("allgather: x must have at least one dimension")
    rows = allgather(np.array([t.shape[0]], dtype=np.int64), name=f"{name}.rows").tolist()
    most = max(rows)
    padded = t.new_zeros((most, *t.shape[1:]))
    padded[: t.shape[0]] = t
    out = t.new_empty((most * size(), *t.shape[1:]))
    comm, code, stream = _cuda_args(t)
    comm.allgather(name, padded.data_ptr(), out.data_ptr(), padded.numel(), code, stream)
    return torch.cat([out[i * most : i * most + n] for i, n in enumerate(rows)])


# ---------------------------------------------------------------- Horovod's build queries
#
# Horovod scripts ask what its library was compiled with. peloton's runtime is one build that
# loads NCCL at run time, so "built" here means "usable in this process"; its own TCP and
# shared-memory transports are not Gloo, MPI, DDL or oneCCL, so those answer False.


def nccl_built() -> int:
    """NCCL's version code (e.g. 22105) if CUDA tensors can go through NCCL here, else 0."""
    if not _nccl_loads()[0]:
        return 0
    version = ctypes.c_int(0)
    # Loaded already (by soname), so this dlopen finds that copy.
    ctypes.CDLL("libnccl.so.2").ncclGetVersion(ctypes.byref(version))
    return int(version.value)


def cuda_built() -> bool:
    """True if CUDA tensors can be reduced here (through NCCL, see :func:`nccl_built`)."""
    return nccl_built() != 0


def rocm_built() -> bool:
    """False: peloton has no ROCm (RCCL) path."""
    return False


def gloo_built() -> bool:
    """False: peloton's TCP and shared-memory transports are its own, not Gloo."""
    return False


def gloo_enabled() -> bool:
    """False: Gloo is never in use (see :func:`gloo_built`)."""
    return False


def mpi_built() -> bool:
    """False: peloton does not use MPI (ranks find each other from PELOTON_PEERS)."""
    return False


def mpi_enabled() -> bool:
    """False: MPI is never in use (see :func:`mpi_built`)."""
    return False


def mpi_threads_supported() -> bool:
    """Raises ValueError, as Horovod does when MPI is not enabled (it never is here)."""
    raise ValueError("peloton does not use MPI, so there are no MPI threads to ask about")


def ddl_built() -> bool:
    """False: peloton has no IBM DDL path."""
    return False


def ccl_built() -> bool:
    """False: peloton has no oneCCL path."""
    return False
