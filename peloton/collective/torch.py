"""Data-parallel training with torch on the peloton collective runtime.

A single-process training script becomes a data-parallel one with a few lines::

    import peloton.collective.torch as pct

    pct.init()                                      # rank, size and peers from PELOTON_*
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * pct.size())
    optimizer = pct.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    pct.broadcast_parameters(model.state_dict(), root_rank=0)
    pct.broadcast_optimizer_state(optimizer, root_rank=0)
    for batch in my_shard_of_the_data:              # each rank trains on its own shard
        optimizer.zero_grad()
        loss_fn(model(batch)).backward()            # gradients are allreduced as they appear
        optimizer.step()                            # waits for the allreduces, then steps

The rest of :mod:`peloton.collective` (``allgather``, ``broadcast``, ``rank``, ...) is re-exported
here, so one import is enough; ``allreduce`` and its variants take Horovod's keywords
(``compression=``, ``prescale_factor=``, ``postscale_factor=``, grouped forms), the reductions
have Horovod's names (``Average``, ``Sum``, ...), and Horovod's ``SyncBatchNorm`` and build
queries are here, so :mod:`peloton.horovod.torch` is this module under Horovod's package name.
This module needs torch; :mod:`peloton.collective` itself never imports it.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import torch

import peloton.collective as pc
from peloton.collective import (
    Adasum,
    Average,
    CollectiveError,
    Handle,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    allgather,
    barrier,
    broadcast,
    broadcast_,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    poll,
    rank,
    reduce_scatter,
    rocm_built,
    shutdown,
    size,
    synchronize,
)
from peloton.collective.compression import Compression, Compressor
from peloton.collective.elastic import State, allgather_object, broadcast_object
from peloton.collective.sampler import ElasticSampler
from peloton.collective.sync_batch_norm import SyncBatchNorm

__all__ = [
    "Adasum",
    "Average",
    "CollectiveError",
    "Compression",
    "Compressor",
    "DistributedOptimizer",
    "Handle",
    "Max",
    "Min",
    "Product",
    "ReduceOp",
    "Sum",
    "SyncBatchNorm",
    "TorchState",
    "allgather",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
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
    "rocm_built",
    "shutdown",
    "size",
    "synchronize",
]

GRADIENT_OPS = ("average", "sum")
# dtypes the runtime reduces natively; others travel as the widest type of their kind.
_WIRE_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64}
)
# Parameters are broadcast packed into buffers of at most this size (one collective each).
_PACK_BYTES = 64 << 20


# ---------------------------------------------------------------- allreduce, Horovod's options


def _allreduce_async(
    tensor: torch.Tensor,
    op: str,
    name: str | None,
    compression: type[Compressor],
    prescale_factor: float,
    postscale_factor: float,
    inplace: bool,
) -> Handle:
    """The one allreduce path: scale, compress, reduce, decompress, scale, (write back)."""
    # Not differentiable: no graph is built through the staging copies (parameters included).
    with torch.no_grad():
        staged = tensor if prescale_factor == 1.0 else tensor * prescale_factor
        wire, ctx = compression.compress(staged)
    if inplace and wire is tensor:
        handle = pc.allreduce_async_(tensor, op=op, name=name)
    else:
        handle = pc.allreduce_async(wire, op=op, name=name)

    @torch.no_grad()
    def finish(reduced: torch.Tensor) -> torch.Tensor:
        # Decompress first, so the post-scaling happens in the caller's (wider) dtype.
        out = compression.decompress(reduced, ctx)
        if postscale_factor != 1.0:
            out.mul_(postscale_factor)  # the fresh result, or `tensor` itself when reduced in place
        if inplace and out is not tensor:
            tensor.copy_(out)
            return tensor
        return out

    return handle.then(finish)


def allreduce_async(
    tensor: torch.Tensor,
    op: str = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Starts an allreduce into a new tensor; ``synchronize(handle)`` returns it.

    ``prescale_factor`` multiplies each rank's tensor before the reduction, ``postscale_factor``
    the result (Horovod's keywords; ``op=Average`` divides by ``size()`` in between).
    """
    return _allreduce_async(
        tensor, op, name, Compression.none, prescale_factor, postscale_factor, inplace=False
    )


def allreduce_async_(
    tensor: torch.Tensor,
    op: str = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Like :func:`allreduce_async`, writing the result into ``tensor``."""
    return _allreduce_async(
        tensor, op, name, Compression.none, prescale_factor, postscale_factor, inplace=True
    )


def allreduce(
    tensor: torch.Tensor,
    op: str = Average,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduces ``tensor`` across ranks into a new tensor of its dtype.

    ``compression=Compression.fp16`` sends floating-point tensors as float16 (half the bytes of
    float32); the result is cast back.
    """
    handle = _allreduce_async(
        tensor, op, name, compression, prescale_factor, postscale_factor, inplace=False
    )
    result: torch.Tensor = handle.wait()
    return result


def allreduce_(
    tensor: torch.Tensor,
    op: str = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Like :func:`allreduce`, writing the result into ``tensor`` and returning it."""
    result: torch.Tensor = allreduce_async_(
        tensor, op, name, prescale_factor, postscale_factor
    ).wait()
    return result


def _grouped_async(
    tensors: Sequence[torch.Tensor],
    op: str,
    name: str | None,
    compression: type[Compressor],
    prescale_factor: float,
    postscale_factor: float,
    inplace: bool,
) -> Handle:
    # Submitted back to back, the runtime fuses them into as few ring passes as fit the buffer.
    return Handle.all(
        [
            _allreduce_async(
                t,
                op,
                None if name is None else f"{name}.{i}",
                compression,
                prescale_factor,
                postscale_factor,
                inplace,
            )
            for i, t in enumerate(tensors)
        ]
    )


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    op: str = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Starts allreduces of a list of tensors (named ``name.0``, ``name.1``, ...) as one
    operation; ``synchronize(handle)`` returns the list of new tensors."""
    return _grouped_async(
        tensors, op, name, Compression.none, prescale_factor, postscale_factor, inplace=False
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    op: str = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Like :func:`grouped_allreduce_async`, writing each result into its tensor."""
    return _grouped_async(
        tensors, op, name, Compression.none, prescale_factor, postscale_factor, inplace=True
    )


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    op: str = Average,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Allreduces a list of tensors as one operation; the list of new tensors."""
    handle = _grouped_async(
        tensors, op, name, compression, prescale_factor, postscale_factor, inplace=False
    )
    result: list[torch.Tensor] = handle.wait()
    return result


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    op: str = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Like :func:`grouped_allreduce`, writing each result into its tensor."""
    handle = grouped_allreduce_async_(tensors, op, name, prescale_factor, postscale_factor)
    result: list[torch.Tensor] = handle.wait()
    return result


# ---------------------------------------------------------------- the optimizer


class DistributedOptimizer(torch.optim.Optimizer):
    """Makes ``optimizer`` allreduce gradients across the ranks before each step.

    ``DistributedOptimizer(optimizer, ...)`` returns ``optimizer`` itself, its class extended (so
    ``isinstance`` checks, LR schedulers, ``state_dict`` and checkpoints keep working). A hook on
    each parameter starts an asynchronous allreduce as soon as its gradient is accumulated, so
    communication overlaps the rest of the backward pass; :meth:`step` first waits for all of them.

    ``named_parameters`` (e.g. ``model.named_parameters()``) names the gradients, the names by
    which the ranks match tensors up; without it the parameters are named by their position in
    the optimizer's groups, which must then be built identically on every rank. ``compression``
    (``Compression.fp16``) is how gradients travel. ``op`` is ``Average`` (default) or ``Sum``.
    With ``backward_passes_per_step=k`` gradients are accumulated locally over ``k`` backward
    passes and allreduced once, on the k-th. ``gradient_predivide_factor=f`` (with ``Average``)
    divides gradients by ``f`` before the sum and by ``size()/f`` after, so float16 sums of many
    ranks stay in range. The arguments are Horovod's, in its order.
    """

    _pc_op: str
    _pc_compression: type[Compressor]
    _pc_predivide: float
    _pc_passes_per_step: int
    _pc_names: dict[torch.Tensor, str]
    _pc_handles: dict[torch.Tensor, Any]
    _pc_passes: dict[torch.Tensor, int]
    _pc_hooks: list[Any]
    _pc_skip: bool

    def __new__(
        cls,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        compression: type[Compressor] = Compression.none,
        backward_passes_per_step: int = 1,
        op: str = Average,
        gradient_predivide_factor: float = 1.0,
    ) -> DistributedOptimizer:
        # Everything is checked before the optimizer is touched: a refusal leaves it as it was.
        if isinstance(optimizer, DistributedOptimizer):
            raise ValueError("optimizer: is already a DistributedOptimizer")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer: expected a torch.optim.Optimizer, got {type(optimizer)}")
        if op == Adasum:
            raise ValueError(pc.ADASUM_REFUSED)
        if op not in GRADIENT_OPS:
            raise ValueError(f"op: must be one of {', '.join(GRADIENT_OPS)} (got {op!r})")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError(
                f"gradient_predivide_factor: only with op=Average (got op={str(op)!r})"
            )
        if not gradient_predivide_factor > 0:
            raise ValueError(
                f"gradient_predivide_factor: must be positive (got {gradient_predivide_factor})"
            )
        if backward_passes_per_step < 1:
            raise ValueError(
                f"backward_passes_per_step: must be at least 1 (got {backward_passes_per_step})"
            )
        names = _gradient_names(optimizer.param_groups, named_parameters)
        base = type(optimizer)
        optimizer.__class__ = type(f"Distributed{base.__name__}", (cls, base), {})
        self = cast(DistributedOptimizer, optimizer)
        self._pc_op = op
        self._pc_compression = compression
        self._pc_predivide = gradient_predivide_factor
        self._pc_passes_per_step = backward_passes_per_step
        self._pc_names = names
        self._pc_handles = {}
        self._pc_passes = dict.fromkeys(names, 0)
        self._pc_skip = False
        self._pc_hooks = [
            p.register_post_accumulate_grad_hook(self._on_gradient)  # type: ignore[no-untyped-call]
            for p in names
        ]
        return self

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        compression: type[Compressor] = Compression.none,
        backward_passes_per_step: int = 1,
        op: str = Average,
        gradient_predivide_factor: float = 1.0,
    ) -> None:
        # Nothing to do: `self` is `optimizer`, initialized by its own class and by __new__.
        pass

    def _on_gradient(self, param: torch.Tensor) -> None:
        """Autograd hook: ``param.grad`` is final for this backward pass."""
        if param in self._pc_handles:
            raise CollectiveError(
                f"gradient {self._pc_names[param]!r} was computed more than "
                f"backward_passes_per_step={self._pc_passes_per_step} times before step(); "
                "call step() (or synchronize()) after each backward pass, or raise "
                "backward_passes_per_step"
            )
        self._pc_passes[param] += 1
        if self._pc_passes[param] == self._pc_passes_per_step:
            self._start(param)

    def _start(self, param: torch.Tensor) -> None:
        grad = param.grad
        if grad is None:
            # Unused on this rank but maybe not on the others: it contributes zeros.
            grad = param.grad = torch.zeros_like(param)
        if grad.is_sparse:
            raise CollectiveError(f"gradient {self._pc_names[param]!r}: sparse is not supported")
        # Average divides by size() in the runtime: f before the sum and size()/f in all.
        predivide = self._pc_predivide
        self._pc_handles[param] = _allreduce_async(
            grad,
            self._pc_op,
            self._pc_names[param],
            self._pc_compression,
            prescale_factor=1.0 / predivide,
            postscale_factor=predivide,
            inplace=False,
        )

    def synchronize(self) -> None:
        """Wait for every gradient's allreduce and write the results into ``.grad``.

        Gradients whose hook has not fired (parameters unused in this step on this rank) are
        allreduced now, as zeros if they have none, so every rank submits the same tensors. Call
        it before touching gradients (clipping), then step inside :meth:`skip_synchronize`.
        """
        try:
            for param in self._pc_names:
                if param not in self._pc_handles:
                    self._start(param)
            for param, handle in self._pc_handles.items():
                result = pc.synchronize(handle)
                grad = param.grad
                assert grad is not None  # _start gave it one
                if result is not None and result is not grad:
                    grad.copy_(_as_tensor(result))
        finally:
            self._pc_handles.clear()
            self._pc_passes = dict.fromkeys(self._pc_names, 0)

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside this block does not synchronize (after an explicit synchronize())."""
        self._pc_skip = True
        try:
            yield
        finally:
            self._pc_skip = False

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Synchronize the gradients (unless skipped), then take the wrapped optimizer's step."""
        if not self._pc_skip:
            self.synchronize()
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``; refused while allreduces are in flight."""
        if self._pc_handles:
            raise CollectiveError(
                "zero_grad() called while gradient allreduces are in flight (after backward(), "
                "before step()); call step() or synchronize() first"
            )
        super().zero_grad(set_to_none)

    def discard_pending(self) -> None:
        """Forgets gradient allreduces in flight (after their gang failed, before a restore)."""
        self._pc_handles.clear()
        self._pc_passes = dict.fromkeys(self._pc_names, 0)

    def remove_hooks(self) -> None:
        """Detach the gradient hooks (the optimizer then no longer allreduces on backward)."""
        for hook in self._pc_hooks:
            hook.remove()
        self._pc_hooks.clear()


def _gradient_names(
    groups: Sequence[Mapping[str, Any]],
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
) -> dict[torch.Tensor, str]:
    """The negotiation name of each trainable parameter of the optimizer, in group order."""
    params = [p for g in groups for p in g["params"] if p.requires_grad]
    if named_parameters is None:
        return {p: f"grad.{i}" for i, p in enumerate(params)}
    by_param: dict[torch.Tensor, str] = {}
    seen: set[str] = set()
    for name, p in named_parameters:
        if name in seen:
            raise ValueError(f"named_parameters: name {name!r} appears twice")
        seen.add(name)
        by_param.setdefault(p, name)
    unnamed = [i for i, p in enumerate(params) if p not in by_param]
    if unnamed:
        raise ValueError(
            f"named_parameters: {len(unnamed)} of the optimizer's parameters have no name "
            f"(positions {unnamed[:5]}); pass model.named_parameters() of the optimized model"
        )
    return {p: f"grad.{by_param[p]}" for p in params}


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    root_rank: int = 0,
) -> None:
    """Overwrite, in place, every rank's tensors with those of ``root_rank``.

    ``params`` is ``model.state_dict()`` (parameters and buffers) or ``model.named_parameters()``.
    Tensors are packed by device and dtype into a few buffers, one broadcast each, instead of one
    collective per tensor.
    """
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"params: {name!r} is a {type(t).__name__}, not a tensor")
    _broadcast_packed([t for _, t in items], root_rank, "broadcast_parameters")


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Give every rank ``root_rank``'s optimizer state (buffers such as momentum, and options).

    Works whether or not the other ranks' optimizers have taken a step yet: the state dict
    travels serialized and is loaded with ``load_state_dict`` (which moves tensors to the
    parameters' devices).
    """
    payload = None
    if pc.rank() == root_rank:
        buf = io.BytesIO()
        torch.save(optimizer.state_dict(), buf)
        payload = buf.getvalue()
    data = _broadcast_bytes(payload, root_rank, "broadcast_optimizer_state")
    if pc.rank() != root_rank:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        optimizer.load_state_dict(state)


def _wire_dtype(t: torch.Tensor) -> torch.dtype:
    if t.dtype in _WIRE_DTYPES:
        return t.dtype
    if t.is_complex():
        raise TypeError(f"complex tensors ({t.dtype}) cannot be broadcast")
    return torch.float64 if t.is_floating_point() else torch.int64


def _broadcast_packed(tensors: Sequence[torch.Tensor], root_rank: int, name: str) -> None:
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, _wire_dtype(t)), []).append(t)
    is_root = pc.rank() == root_rank
    n = 0
    for (_, dtype), group in groups.items():
        for pack in _packs(group, dtype.itemsize):
            flat = torch.cat([t.detach().reshape(-1).to(dtype) for t in pack])
            pc.broadcast_(flat, root_rank, name=f"{name}.{n}")
            n += 1
            if is_root:
                continue
            with torch.no_grad():
                for t, piece in zip(
                    pack, torch.split(flat, [t.numel() for t in pack]), strict=True
                ):
                    t.copy_(piece.view(t.shape))


def _packs(tensors: Sequence[torch.Tensor], itemsize: int) -> Iterator[list[torch.Tensor]]:
    """Consecutive runs of ``tensors`` of at most ``_PACK_BYTES`` (or a single bigger one)."""
    pack: list[torch.Tensor] = []
    nbytes = 0
    for t in tensors:
        size_t = t.numel() * itemsize
        if pack and nbytes + size_t > _PACK_BYTES:
            yield pack
            pack, nbytes = [], 0
        pack.append(t)
        nbytes += size_t
    if pack:
        yield pack


def _broadcast_bytes(payload: bytes | None, root_rank: int, name: str) -> bytes:
    """Broadcast a byte string from ``root_rank`` (``payload`` is ignored elsewhere)."""
    length = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
    pc.broadcast_(length, root_rank, name=f"{name}.length")
    n = int(length.item())
    words = torch.zeros((n + 7) // 8, dtype=torch.int64)
    if payload is not None:
        words.view(torch.uint8)[:n] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    pc.broadcast_(words, root_rank, name=f"{name}.data")
    return bytes(words.view(torch.uint8)[:n].numpy().tobytes())


def _as_tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _is_lr_scheduler(value: Any) -> bool:
    """Whether ``value`` is a torch learning-rate scheduler (ReduceLROnPlateau included, which
    older torch releases do not derive from the base class)."""
    schedulers = torch.optim.lr_scheduler
    base = getattr(schedulers, "LRScheduler", None) or schedulers._LRScheduler
    return isinstance(value, base | schedulers.ReduceLROnPlateau)


class TorchState(State):
    """Elastic state of a torch model and optimizer (plus user values, see
    :class:`peloton.collective.elastic.State`): ``commit()`` keeps copies of their state dicts,
    ``restore()`` loads them back, ``sync()`` gives every rank rank 0's.

    A value that is an :class:`~peloton.collective.sampler.ElasticSampler` (Horovod's
    ``TorchState(model, optimizer, train_sampler=sampler, epoch=0)``) stays the same object:
    ``commit()`` keeps its epoch and the indices processed by all ranks (united across the gang),
    ``restore()`` and ``sync()`` load them into it, and it re-shards what is left of the epoch.
    A value that is a learning-rate scheduler (``torch.optim.lr_scheduler``, as Horovod's state
    handlers take) stays the same object too: its ``state_dict()`` is committed, restored and
    given to every rank from rank 0.

    Steps lost to a rollback (:meth:`steps_lost`): the optimizer's ``step()`` calls since the last
    commit when there were any, else the rule of the user values (``step``, ``batch``,
    ``steps``; see :class:`~peloton.collective.elastic.State`).
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        **values: Any,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self._optimizer_steps = 0  # optimizer steps since the last commit (or restore)
        if optimizer is not None:
            self._count_optimizer_steps(optimizer)
        self._samplers = {k: v for k, v in values.items() if isinstance(v, ElasticSampler)}
        self._samplers_saved: dict[str, dict[str, Any]] = {}
        self._schedulers = {k: v for k, v in values.items() if _is_lr_scheduler(v)}
        self._schedulers_saved: dict[str, dict[str, Any]] = {}
        for k, v in (self._samplers | self._schedulers).items():
            setattr(self, k, v)
        kept = self._samplers.keys() | self._schedulers.keys()
        super().__init__(**{k: v for k, v in values.items() if k not in kept})

    def _count_optimizer_steps(self, optimizer: torch.optim.Optimizer) -> None:
        def count(*_: Any) -> None:
            self._optimizer_steps += 1

        register = getattr(optimizer, "register_step_post_hook", None)
        if register is not None:
            register(count)
            return
        # An older torch: wrap this optimizer's step itself.
        step = optimizer.step

        def counted_step(*args: Any, **kwargs: Any) -> Any:
            result = step(*args, **kwargs)
            count()
            return result

        optimizer.step = counted_step  # type: ignore[method-assign]

    def steps_lost(self) -> int:
        """Optimizer steps since the last commit if there were any, else the user values' rule
        (see :class:`~peloton.collective.elastic.State`)."""
        return self._optimizer_steps if self._optimizer_steps > 0 else super().steps_lost()

    def save(self) -> None:
        # The collective part first: if a peer dies in it, nothing of the last commit changed.
        samplers = {k: self._gang_sampler_state(s) for k, s in self._samplers.items()}
        super().save()
        self._optimizer_steps = 0
        self._model_saved = (
            copy.deepcopy(self.model.state_dict()) if self.model is not None else None
        )
        self._optimizer_saved = (
            copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None
        )
        self._samplers_saved = samplers
        self._schedulers_saved = {
            k: copy.deepcopy(s.state_dict()) for k, s in self._schedulers.items()
        }

    def restore(self) -> None:
        super().restore()
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None and self._optimizer_saved is not None:
            if isinstance(self.optimizer, DistributedOptimizer):
                self.optimizer.discard_pending()
            self.optimizer.load_state_dict(self._optimizer_saved)
        for k, s in self._samplers.items():
            s.load_state_dict(self._samplers_saved[k])
        for k, sched in self._schedulers.items():
            sched.load_state_dict(copy.deepcopy(self._schedulers_saved[k]))
        self._optimizer_steps = 0

    def sync(self) -> None:
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        for s in self._samplers.values():
            s.load_state_dict(broadcast_object(self._gang_sampler_state(s)))
        for sched in self._schedulers.values():
            sched.load_state_dict(broadcast_object(sched.state_dict()))
        super().sync()

    @staticmethod
    def _gang_sampler_state(sampler: ElasticSampler) -> dict[str, Any]:
        """The sampler's state with the indices every rank of the gang processed."""
        state = sampler.state_dict()
        if pc.is_initialized() and pc.size() > 1:
            state["processed_indices"] = set().union(*allgather_object(state["processed_indices"]))
        return state
