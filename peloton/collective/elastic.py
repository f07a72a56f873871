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
:class:`HostsUpdatedInterrupt` on every rank at the same step: the state is kept as it is (and
committed, so a failure while the next generation forms does not roll it back). After
each re-form the reset callbacks run (e.g. to scale the learning rate by the new size). If no
generation of at least the gang's minimum forms within ``PELOTON_ELASTIC_TIMEOUT`` seconds, the
worker raises :class:`RendezvousError` (the gang has failed; the process exits non-zero).
A script that called ``init()`` before (as Horovod's do) has that runtime shut down by
:func:`run`, which then joins the endpoint as above.

The worker's id at the endpoint is its task's ``PELOTON_ATTEMPT_ID`` when the scheduler set one
(a random one otherwise). When the training function returns on a rank, :func:`run` tells the
endpoint the gang is done: a worker that joins after that is told so and exits 0
(:class:`GangFinished`). The scheduler shrinks the gang by draining workers: the gang stops at its
next commit with the state kept and re-forms without them, and a drained worker leaves and exits
0 (:class:`Drained`). A SIGTERM (a worker stopped with a grace period) drains this worker the same
way; a second SIGTERM kills it. A failure report carries the steps the rollback throws away
(:meth:`State.steps_lost`), which the scheduler records.
"""

from __future__ import annotations

import copy
import functools
import numbers
import os
import pickle
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, TypeVar

import numpy as np

import peloton.collective as pc
from peloton.collective import _core
from peloton.collective.rendezvous import (
    Drained,
    GangFinished,
    Membership,
    RendezvousClient,
    RendezvousError,
    free_port,
)
from peloton.core import gangenv

__all__ = [
    "Drained",
    "GangFinished",
    "HostsUpdatedInterrupt",
    "Membership",
    "RendezvousError",
    "State",
    "allgather_object",
    "broadcast_object",
    "membership",
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


# User values whose progress since the last commit counts the training steps a restore loses.
STEP_NAMES = ("step", "batch", "steps")


class State:
    """Training state that survives re-forms: user values given as keywords (``state.step``).

    Subclasses (e.g. :class:`peloton.collective.torch.TorchState`) add what they hold by
    overriding :meth:`save`, :meth:`restore` and :meth:`sync` (and :meth:`steps_lost`).

    Steps lost: when a generation fails, :meth:`restore` throws away what was done since the
    last commit; :meth:`steps_lost` says how many training steps that is, and :func:`run` reports
    it to the endpoint. The rule: the first of the user values ``step``, ``batch``, ``steps``
    that is an integer (now and at the last commit) counts them: its current value minus its
    committed value (0 if it went down, e.g. a batch counter reset by a new epoch); without such
    a value, 0. :class:`~peloton.collective.torch.TorchState` counts its optimizer's steps instead
    when there were any.
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

    def steps_lost(self) -> int:
        """Training steps since the last commit, which :meth:`restore` throws away (see the class
        doc for the rule)."""
        for k in STEP_NAMES:
            if k not in self._keys:
                continue
            now, then = _as_int(getattr(self, k)), _as_int(self._saved.get(k))
            if now is not None and then is not None:
                return max(0, now - then)
        return 0

    def sync(self) -> None:
        """Gives every rank rank 0's state (after every (re-)form) and commits it."""
        values = {k: getattr(self, k) for k in self._keys}
        for k, v in broadcast_object(values).items():
            setattr(self, k, v)
        self.save()


def membership() -> Membership | None:
    """This worker's place in the gang now (generation, rank, members); None outside
    :func:`run`."""
    s = _session
    return s.membership if s is not None else None


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


def _as_int(value: object) -> int | None:
    """An integer value (numpy's too, not a bool) as an int, else None."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


def _connect() -> RendezvousClient:
    address = os.environ.get(gangenv.RENDEZVOUS)
    if not address:
        raise RendezvousError(
            f"{gangenv.RENDEZVOUS} is not set: elastic training needs a rendezvous endpoint "
            "(peloton-run --elastic serves one)"
        )
    timeout = gangenv.elastic_timeout(os.environ)
    token = os.environ.get(gangenv.RENDEZVOUS_TOKEN, "")
    # The scheduler knows its tasks by their attempt id: it drains and removes workers by it.
    worker = os.environ.get(gangenv.ATTEMPT_ID) or uuid.uuid4().hex
    return RendezvousClient(address, token, worker, timeout)


def _log(message: str) -> None:
    print(f"peloton.elastic: {message}", file=sys.stderr, flush=True)


def _drain_on_sigterm(client: RendezvousClient) -> Callable[[], None]:
    """In the main thread: the first SIGTERM asks the endpoint to drain this worker (it leaves at
    its next commit, the state committed); a second one gets the default action (death). Returns
    what puts the previous handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    seen = False

    def on_sigterm(signum: int, _frame: FrameType | None) -> None:
        nonlocal seen
        if seen:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        seen = True
        client.request_drain("SIGTERM")

    signal.signal(signal.SIGTERM, on_sigterm)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

    return restore


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
        restore_sigterm = _drain_on_sigterm(client)
        try:
            while True:
                try:
                    me = client.join(f"{host}:{free_port(host)}")
                except Drained as exc:
                    _log(f"drained by the scheduler ({exc.reason}): leaving the gang")
                    raise SystemExit(0) from None
                except GangFinished:
                    _log("the gang finished before this worker joined")
                    raise SystemExit(0) from None
                _session = _Session(client, me)
                _log(f"generation {me.generation}: rank {me.rank} of {me.size}")
                _end_when_closed(client, me.generation)
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
                        # Not the variables: a scheduled task's describe the layout it was
                        # launched in, not this generation's.
                        cross_rank=where.cross_rank,
                        cross_size=where.cross_size,
                    )
                    state.sync()
                    if not first:
                        state.on_reset()
                    first = False
                    result = func(state, *args, **kwargs)
                except HostsUpdatedInterrupt:
                    _log(f"generation {me.generation} ended: re-forming, state kept")
                    _keep(state)
                    pc.shutdown()
                    continue
                except pc.CollectiveError as exc:
                    lost = state.steps_lost()
                    _log(
                        f"generation {me.generation} failed ({exc}): restoring the last commit "
                        f"({lost} steps lost)"
                    )
                    client.report_failure(me.generation, str(exc), lost)
                    pc.shutdown()
                    state.restore()
                    continue
                pc.shutdown()
                client.done()
                return result
        finally:
            _session = None
            restore_sigterm()
            pc.shutdown()
            client.leave()

    return wrapper


def _keep(state: State) -> None:
    """Commits the state the gang stopped at on a graceful change (the ranks agreed on it), so
    that a failure while the next generation forms rolls back to it, not to an older commit. If
    the commit itself fails (a peer died meanwhile), the last commit stays what it was."""
    try:
        state.save()
    except pc.CollectiveError as exc:
        _log(f"could not commit the kept state ({exc}): the last commit stays")


def _end_when_closed(client: RendezvousClient, generation: int) -> None:
    """When ``generation`` ends, tell the runtime: a rank still connecting to its peers for it
    (one died just after the generation formed) gives up at once instead of waiting out the
    collective timeout, and re-joins."""

    def watch() -> None:
        client.watch(generation)
        _core.end_generation(generation)

    threading.Thread(target=watch, name=f"generation-{generation}", daemon=True).start()


def _split(entry: str) -> tuple[str, int]:
    host, _, port = entry.rpartition(":")
    return host, int(port)
