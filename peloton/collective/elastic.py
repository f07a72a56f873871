"""Elastic training: a gang that survives losing ranks and takes in new ones.

::

    import peloton.collective as pc
    from peloton.collective import elastic

    state = elastic.State(params=np.zeros(10), step=0)

    @elastic.run
    def train(state):
        while state.step < 100:
            grad = ...
            state.params -= pc.allreduce(grad)
            state.step += 1
            state.commit()          # a copy to fall back to; raises at a membership change

    train(state)

Membership comes from the gang's rendezvous endpoint (``PELOTON_RENDEZVOUS``, see
:mod:`peloton.collective.rendezvous`). :func:`run` joins it, starts the runtime for the
generation it got, gives every rank rank 0's state (:meth:`State.sync`) and calls the training
function. When a peer dies the collective in flight raises on every survivor: they restore the
last commit, re-join, re-form at the new size and call the function again. When the membership
changes gracefully (a worker joined) the endpoint says so and the next ``commit()`` raises
:class:`HostsUpdatedInterrupt` on every rank at the same step: the state is kept as it is. After
each re-form the reset callbacks run (e.g. to scale the learning rate by the new size). If no
generation of at least the gang's minimum forms within ``PELOTON_ELASTIC_TIMEOUT`` seconds, the
worker raises :class:`RendezvousError` (the gang has failed; the process exits non-zero).
A script that called ``init()`` before (as Horovod's do) has that runtime shut down by
:func:`run`, which then joins the endpoint as above.
"""

from __future__ import annotations

import copy
import functools
import os
import pickle
import sys
import uuid
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

import peloton.collective as pc
from peloton.collective.rendezvous import Membership, RendezvousClient, RendezvousError, free_port
from peloton.core import gangenv

__all__ = [
    "HostsUpdatedInterrupt",
    "Membership",
    "RendezvousError",
    "State",
    "allgather_object",
    "broadcast_object",
    "run",
    "wait_for_change",
]

R = TypeVar("R")


class HostsUpdatedInterrupt(Exception):
    """The gang's membership changed gracefully; raised by :meth:`State.commit` on every rank."""


class _Session:
    """This process's place in the elastic gang: its endpoint session and generation."""

    def __init__(self, client: RendezvousClient, membership: Membership) -> None:
        self.client = client
        self.membership = membership


_session: _Session | None = None


class State:
    """Training state that survives re-forms: user values given as keywords (``state.step``).

    Subclasses (e.g. :class:`peloton.collective.torch.TorchState`) add what they hold by
    overriding :meth:`save`, :meth:`restore` and :meth:`sync`.
    """

    def __init__(self, **values: Any) -> None:
        self._keys = list(values)
        self._callbacks: list[Callable[[], None]] = []
        for k, v in values.items():
            setattr(self, k, v)
        self._saved: dict[str, Any] = {}
        self.save()

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Callbacks to run after every re-form (not the first start), in order."""
        self._callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for cb in self._callbacks:
            cb()

    def commit(self) -> None:
        """Keeps a copy of the state to restore after a failure, then checks for a membership
        change (see :meth:`check_host_updates`)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raises HostsUpdatedInterrupt on every rank if the generation ended anywhere (the ranks
        agree through one small allreduce, so they all stop at the same step)."""
        s = _session
        if s is None:
            return
        ended = np.array([int(s.client.closed(s.membership.generation))], dtype=np.int32)
        if int(pc.allreduce(ended, op="max", name="peloton.elastic.host_updates")[0]):
            raise HostsUpdatedInterrupt(f"generation {s.membership.generation} ended")

    def save(self) -> None:
        """Copies the user values (commit() calls it)."""
        self._saved = {k: copy.deepcopy(getattr(self, k)) for k in self._keys}

    def restore(self) -> None:
        """Goes back to the last commit."""
        for k, v in self._saved.items():
            setattr(self, k, copy.deepcopy(v))

    def sync(self) -> None:
        """Gives every rank rank 0's state (after every (re-)form) and commits it."""
        values = {k: getattr(self, k) for k in self._keys}
        for k, v in broadcast_object(values).items():
            setattr(self, k, v)
        self.save()


def wait_for_change(timeout: float | None = None) -> bool:
    """Blocks until the current generation ends (e.g. a worker joins: a trainer may wait for the
    gang to grow); True if it did, False after ``timeout``. The next commit() then raises."""
    s = _session
    if s is None:
        raise RendezvousError("wait_for_change: not inside elastic.run")
    return s.client.watch(s.membership.generation, timeout)


def broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    """``root_rank``'s obj (pickled) on every rank."""
    data = pickle.dumps(obj) if pc.rank() == root_rank else b""
    length = pc.broadcast(np.array([len(data)], dtype=np.int64), root_rank, name="peloton.obj.len")
    n = int(length[0])
    words = np.zeros((n + 7) // 8, dtype=np.int64)
    if data:
        words.view(np.uint8)[:n] = np.frombuffer(data, dtype=np.uint8)
    words = pc.broadcast(words, root_rank, name="peloton.obj.data")
    return obj if pc.rank() == root_rank else pickle.loads(words.view(np.uint8)[:n].tobytes())


def allgather_object(obj: Any) -> list[Any]:
    """Every rank's obj (pickled), in rank order, on every rank."""
    return [broadcast_object(obj, root_rank=r) for r in range(pc.size())]


def _connect() -> RendezvousClient:
    address = os.environ.get(gangenv.RENDEZVOUS)
    if not address:
        raise RendezvousError(
            f"{gangenv.RENDEZVOUS} is not set: elastic training needs a rendezvous endpoint "
            "(peloton-run --elastic serves one)"
        )
    timeout = gangenv.elastic_timeout(os.environ)
    token = os.environ.get(gangenv.RENDEZVOUS_TOKEN, "")
    return RendezvousClient(address, token, uuid.uuid4().hex, timeout)


def _log(message: str) -> None:
    print(f"peloton.elastic: {message}", file=sys.stderr, flush=True)


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Wraps ``func(state, ...)`` so that it runs in the elastic gang (see the module doc)."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        global _session
        client = _connect()
        # Peers reach our runtime at the address we reach the endpoint from.
        host = client.local_host
        first = True
        if pc.is_initialized():
            # The script called init() first (as Horovod's do): the gang re-forms from the
            # endpoint, and rank 0's state is given to every rank as after any re-form.
            pc.shutdown()
        try:
            while True:
                me = client.join(f"{host}:{free_port(host)}")
                _session = _Session(client, me)
                _log(f"generation {me.generation}: rank {me.rank} of {me.size}")
                try:
                    hosts = [h for h, _ in map(_split, me.members)]
                    where = gangenv.topology(hosts)[me.rank]
                    pc.init(
                        rank=me.rank,
                        size=me.size,
                        peers=list(me.members),
                        local_rank=where.local_rank,
                        local_size=where.local_size,
                        generation=me.generation,
                    )
                    state.sync()
                    if not first:
                        state.on_reset()
                    first = False
                    result = func(state, *args, **kwargs)
                except HostsUpdatedInterrupt:
                    _log(f"generation {me.generation} ended: re-forming, state kept")
                    pc.shutdown()
                    continue
                except pc.CollectiveError as exc:
                    _log(f"generation {me.generation} failed ({exc}): restoring the last commit")
                    client.report_failure(me.generation, str(exc))
                    pc.shutdown()
                    state.restore()
                    continue
                pc.shutdown()
                return result
        finally:
            _session = None
            pc.shutdown()
            client.leave()

    return wrapper


def _split(entry: str) -> tuple[str, int]:
    host, _, port = entry.rpartition(":")
    return host, int(port)
