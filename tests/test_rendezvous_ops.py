"""What the scheduler's daemon needs of an elastic gang's rendezvous endpoint: generation and
rollback callbacks, draining and removing workers, a finished gang, the steps a rollback loses,
and a worker stopped by SIGTERM leaving the gang gracefully under ``peloton-run --elastic``."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from collective_support import free_ports
from test_collective_elastic import DEADLINE_S, RUN, client, expected_params, in_threads, join

import peloton.collective as pc
from peloton.collective import _core, elastic
from peloton.collective.rendezvous import (
    Drained,
    GangFinished,
    Generation,
    Membership,
    RendezvousClient,
    RendezvousError,
    RendezvousServer,
)
from peloton.core import gangenv

DRAIN_TRAINER = str(Path(__file__).with_name("elastic_drain_train.py"))


class Events:
    """The server's callbacks and log lines, to await from the test thread."""

    def __init__(self) -> None:
        self.calls: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._lines: list[str] = []
        self._cond = threading.Condition()

    def on_generation(self, g: Generation) -> None:
        self.calls.put(("generation", g))

    def on_rollback(self, steps: int) -> None:
        self.calls.put(("rollback", steps))

    def log(self, line: str) -> None:
        with self._cond:
            self._lines.append(line)
            self._cond.notify_all()

    def next(self, what: str) -> tuple[str, Any]:
        try:
            return self.calls.get(timeout=DEADLINE_S)
        except queue.Empty:
            raise AssertionError(f"no callback within {DEADLINE_S} s (waited on {what})") from None

    def generation(self) -> Generation:
        kind, g = self.next("on_generation")
        assert kind == "generation", (kind, g)
        assert isinstance(g, Generation)
        return g

    def wait_log(self, pattern: str) -> None:
        with self._cond:
            found = self._cond.wait_for(
                lambda: any(re.search(pattern, line) for line in self._lines), DEADLINE_S
            )
        assert found, f"the server did not log {pattern!r} within {DEADLINE_S} s: {self._lines}"


@pytest.fixture
def events() -> Events:
    return Events()


def server_with(events: Events, min_size: int, max_size: int, expect: int) -> RendezvousServer:
    return RendezvousServer(
        "secret",
        min_size,
        max_size,
        expect=expect,
        log=events.log,
        on_generation=events.on_generation,
        on_rollback=events.on_rollback,
    )


@dataclass(frozen=True)
class Raised:
    error: RendezvousError


def refused(call: Callable[[], Membership]) -> Callable[[], Membership | Raised]:
    """The call, returning the RendezvousError it raises (in_threads re-raises exceptions)."""

    def run() -> Membership | Raised:
        try:
            return call()
        except RendezvousError as exc:
            return Raised(exc)

    return run


def drained(outcome: object, reason: str) -> bool:
    return (
        isinstance(outcome, Raised)
        and isinstance(outcome.error, Drained)
        and outcome.error.reason == reason
    )


def by_rank(names: str, got: list[Membership]) -> tuple[str, ...]:
    """The worker names in rank order, from each one's membership."""
    return tuple(name for _, name in sorted(zip((m.rank for m in got), names, strict=True)))


def test_on_generation_reports_members_and_previous_in_rank_order(events: Events) -> None:
    with server_with(events, 2, 3, expect=3) as server:
        a, b, c = (client(server, n) for n in "abc")
        first = in_threads(join(a, 1001), join(b, 1002), join(c, 1003))
        g1 = events.generation()
        assert (g1.number, g1.members, g1.previous) == (1, by_rank("abc", first), ())
        assert g1.waited >= 0.0
        c.close()
        assert a.watch(1, DEADLINE_S) and b.watch(1, DEADLINE_S), "c's loss did not end gen 1"
        second = in_threads(join(a, 2001), join(b, 2002))
        g2 = events.generation()
        assert (g2.number, g2.members, g2.previous) == (2, by_rank("ab", second), g1.members)
        assert g2.waited >= 0.0


def test_a_slow_callback_does_not_stall_the_rendezvous() -> None:
    release = threading.Event()
    seen: queue.Queue[int] = queue.Queue()

    def on_generation(g: Generation) -> None:
        seen.put(g.number)
        assert release.wait(DEADLINE_S), "the test never released the callback"

    with RendezvousServer("secret", 1, 2, expect=2, on_generation=on_generation) as server:
        a, b = client(server, "a"), client(server, "b")
        in_threads(join(a, 1), join(b, 2))
        assert seen.get(timeout=DEADLINE_S) == 1, "on_generation(1) was not called"
        # The callback of generation 1 is still running: generation 2 forms all the same.
        b.close()
        assert a.watch(1, DEADLINE_S), "b's loss did not end generation 1"
        assert a.join("127.0.0.1:3").generation == 2
        assert seen.empty(), "on_generation(2) ran before on_generation(1) returned"
        release.set()
        assert seen.get(timeout=DEADLINE_S) == 2, "on_generation(2) was not called"


def test_drain_of_a_member_closes_the_generation_and_the_rest_reform_without_it(
    events: Events,
) -> None:
    with server_with(events, 1, 3, expect=3) as server:
        a, b, c = (client(server, n) for n in "abc")
        in_threads(join(a, 1), join(b, 2), join(c, 3))
        events.generation()
        server.drain(["b"], "the scheduler shrinks the gang")
        assert all(x.watch(1, DEADLINE_S) for x in (a, b, c)), "the drain did not end gen 1"
        # The survivors re-form without waiting for the drained worker to ask.
        second = in_threads(join(a, 4), join(c, 5))
        assert [m.size for m in second] == [2, 2]
        g2 = events.generation()
        assert (g2.number, g2.members) == (2, by_rank("ac", second))
        with pytest.raises(Drained, match="the scheduler shrinks the gang") as info:
            b.join("127.0.0.1:6")
        assert info.value.reason == "the scheduler shrinks the gang"


def test_a_drained_worker_waiting_to_join_is_answered_at_once(events: Events) -> None:
    with server_with(events, 1, 2, expect=1) as server:
        b = client(server, "b")
        assert b.join("127.0.0.1:1").generation == 1
        a = client(server, "a")

        def drain_a_once_it_waits() -> None:
            events.wait_log("closed: worker a joined")
            server.drain(["a"], "not needed")

        got = in_threads(refused(join(a, 2)), drain_a_once_it_waits)
        assert drained(got[0], "not needed"), got
        # a's join ended generation 1: b re-forms alone, without a.
        assert b.watch(1, DEADLINE_S), "a's join did not end generation 1"
        assert b.join("127.0.0.1:3") == Membership(2, 0, ("127.0.0.1:3",))


def test_a_drained_id_that_connects_later_is_refused_the_same_way(events: Events) -> None:
    with server_with(events, 1, 2, expect=2) as server:
        server.drain(["late"], "scale down")
        # The first generation no longer waits for the drained worker.
        a = client(server, "a")
        assert a.join("127.0.0.1:1").size == 1
        late = client(server, "late")
        with pytest.raises(Drained, match="scale down"):
            late.join("127.0.0.1:2")
        assert not a.closed(1), "a drained worker's join ended the generation"


def test_a_worker_may_ask_to_be_drained(events: Events) -> None:
    with server_with(events, 1, 2, expect=2) as server:
        a, b = client(server, "a"), client(server, "b")
        in_threads(join(a, 1), join(b, 2))
        a.request_drain("SIGTERM")
        assert b.watch(1, DEADLINE_S), "a's drain request did not end generation 1"
        got = in_threads(refused(join(a, 3)), join(b, 4))
        assert drained(got[0], "SIGTERM"), got
        assert got[1] == Membership(2, 0, ("127.0.0.1:4",))


def test_remove_of_a_member_closes_the_generation(events: Events) -> None:
    with server_with(events, 1, 2, expect=2) as server:
        a, b = client(server, "a"), client(server, "b")
        in_threads(join(a, 1), join(b, 2))
        events.generation()
        server.remove("b", "its host was lost")
        assert a.watch(1, DEADLINE_S), "removing b did not end generation 1"
        assert b.watch(1, DEADLINE_S), "b's session was not shut down"
        with pytest.raises(RendezvousError, match="went away"):
            b.join("127.0.0.1:3")
        assert a.join("127.0.0.1:4").generation == 2
        g2 = events.generation()
        assert g2.members == ("a",) and sorted(g2.previous) == ["a", "b"], g2
        events.wait_log("^worker b removed: its host was lost")


def test_after_a_worker_is_done_joins_are_answered_finished(events: Events) -> None:
    with server_with(events, 1, 3, expect=2) as server:
        a, b = client(server, "a"), client(server, "b")
        in_threads(join(a, 1), join(b, 2))
        assert not server.finished
        waiter = client(server, "waiter")

        def done_once_it_waits() -> None:
            events.wait_log("closed: worker waiter joined")
            a.done()

        got = in_threads(refused(join(waiter, 3)), done_once_it_waits)
        assert isinstance(got[0], Raised) and isinstance(got[0].error, GangFinished), got
        assert server.finished
        late = client(server, "late")  # a session that connects after: ok, then finished
        with pytest.raises(GangFinished):
            late.join("127.0.0.1:4")


def test_the_steps_lost_of_a_failed_generation_reach_on_rollback(events: Events) -> None:
    with server_with(events, 1, 3, expect=3) as server:
        a, b, c = (client(server, n) for n in "abc")
        in_threads(join(a, 1), join(b, 2), join(c, 3))
        assert events.generation().number == 1
        c.close()  # c died; the survivors' collectives failed
        a.report_failure(1, "rank 2 is gone", steps_lost=3)
        b.report_failure(1, "rank 2 is gone", steps_lost=4)
        in_threads(join(a, 4), join(b, 5))
        # The most steps any member lost, once, before the next generation's callback.
        assert events.next("on_rollback") == ("rollback", 4)
        assert events.generation().number == 2
        # A failure after which no generation forms is reported when the server closes.
        a.report_failure(2, "rank 1 is gone", steps_lost=2)
        events.wait_log("reported: rank 1 is gone")
    assert events.next("on_rollback at close") == ("rollback", 2)
    assert events.calls.empty(), events.calls.queue


def test_state_counts_steps_lost_from_its_step_value() -> None:
    state = elastic.State(params=np.zeros(2), step=0)
    state.step = 5
    state.commit()  # outside elastic.run: no membership to check
    state.step = 8
    assert state.steps_lost() == 3
    state.restore()
    assert state.step == 5 and state.steps_lost() == 0
    # The first integer of step, batch, steps counts (numpy's too); none: 0.
    batches = elastic.State(step="warmup", batch=np.int64(2))
    batches.batch += 4
    assert batches.steps_lost() == 4
    assert elastic.State(epoch=1, done=True).steps_lost() == 0
    # A counter that went down (a new epoch) lost nothing it can tell.
    epoch = elastic.State(batch=7)
    epoch.batch = 1
    assert epoch.steps_lost() == 0


def test_torch_state_counts_optimizer_steps_since_the_commit() -> None:
    torch = pytest.importorskip("torch")
    from peloton.collective.torch import TorchState

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TorchState(model, opt, step=0)

    def step() -> None:
        opt.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        opt.step()

    step()
    step()
    assert state.steps_lost() == 2
    state.commit()
    assert state.steps_lost() == 0
    state.step = 5  # no optimizer step since the commit: the user value counts
    assert state.steps_lost() == 5
    step()
    assert state.steps_lost() == 1
    state.restore()
    assert state.steps_lost() == 0


@pytest.fixture
def endpoint_env(monkeypatch: pytest.MonkeyPatch, events: Events) -> Iterator[RendezvousServer]:
    with server_with(events, 1, 2, expect=2) as server:
        monkeypatch.setenv(gangenv.RENDEZVOUS, server.address)
        monkeypatch.setenv(gangenv.RENDEZVOUS_TOKEN, server.token)
        monkeypatch.setenv(gangenv.ELASTIC_TIMEOUT, "10")
        monkeypatch.setenv(gangenv.ATTEMPT_ID, "job-1-0-1")
        yield server


def never_called(state: elastic.State) -> None:
    raise AssertionError("the training function ran")


def test_elastic_run_of_a_drained_attempt_leaves_and_exits_0(
    endpoint_env: RendezvousServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # The worker's id is its attempt id: the scheduler drains it by that id.
    endpoint_env.drain(["job-1-0-1"], "the gang shrinks to 1")
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as info:
        elastic.run(never_called)(elastic.State(step=0))
    assert info.value.code == 0
    assert signal.getsignal(signal.SIGTERM) is handler, "the SIGTERM handler was not restored"
    assert (
        "peloton.elastic: drained by the scheduler (the gang shrinks to 1): leaving the gang"
        in capsys.readouterr().err
    )


def test_elastic_run_after_the_gang_finished_exits_0(
    endpoint_env: RendezvousServer, events: Events, capsys: pytest.CaptureFixture[str]
) -> None:
    done = RendezvousClient(endpoint_env.address, endpoint_env.token, "first", 10.0)
    done.done()
    events.wait_log("the gang finished")
    with pytest.raises(SystemExit) as info:
        elastic.run(never_called)(elastic.State(step=0))
    assert info.value.code == 0
    assert "peloton.elastic: the gang finished before this worker joined" in capsys.readouterr().err


def test_a_rank_stopped_by_sigterm_leaves_at_its_commit_and_the_gang_goes_on() -> None:
    env = {k: v for k, v in os.environ.items() if k != gangenv.ATTEMPT_ID}
    env |= {"STEPS": "12", "TERM_AT": "6", "COMMIT_EVERY": "3"}
    proc = subprocess.Popen(
        [*RUN, "--elastic", "--min", "1", "--max", "3", "-np", "3", sys.executable, DRAIN_TRAINER],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    out: list[str] = []
    err: list[str] = []

    def pump_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            lines.put(line)
        lines.put(None)

    def pump_err() -> None:
        assert proc.stderr is not None
        err.extend(proc.stderr)

    pumps = [threading.Thread(target=f, daemon=True) for f in (pump_out, pump_err)]
    for t in pumps:
        t.start()
    try:
        victim, pid = "", None
        while pid is None:
            try:
                line = lines.get(timeout=DEADLINE_S)
            except queue.Empty:
                raise AssertionError(
                    f"rank 2 of generation 1 did not reach step 6 in {DEADLINE_S} s"
                ) from None
            assert line is not None, f"the gang ended before its rank 2 reached step 6: {out} {err}"
            # Output is prefixed with peloton-run's rank, which need not be the generation's.
            if m := re.match(r"^\[(\d+)\] term-me (\d+)$", line):
                victim, pid = m[1], int(m[2])
        os.kill(pid, signal.SIGTERM)
        rc = proc.wait(timeout=DEADLINE_S)
        for t in pumps:
            t.join(DEADLINE_S)
            assert not t.is_alive(), "peloton-run's output did not end"
    finally:
        proc.kill()
        proc.wait()
    stdout, stderr = "".join(out), "".join(err)
    assert rc == 0, stdout + stderr
    # The stopped rank left at its commit and exited 0; no rank rolled back.
    assert f"[{victim}] exit 0\n" in stdout, stdout + stderr
    drain = f"[{victim}] peloton.elastic: drained by the scheduler (SIGTERM): leaving the gang\n"
    assert drain in stderr, stderr
    assert not re.search(rf"rank {victim} (exited|was killed)", stderr), stderr
    assert "restoring" not in stderr, stderr
    survivors = sorted({"0", "1", "2"} - {victim})
    for r in survivors:
        gens = re.findall(
            rf"^\[{r}\] peloton.elastic: generation (\d+): rank \d of (\d)$", stderr, re.M
        )
        assert gens == [("1", "3"), ("2", "2")], stderr
    # Steps 0-5 at size 3, committed at 6, then 6-11 at size 2: each applied once.
    applied = re.findall(r"^\[\d+\] applied (\d+) (\d+)$", stdout, re.M)
    assert applied == [(str(s), "3" if s < 6 else "2") for s in range(12)], stdout
    want = " ".join(str(int(x)) for x in expected_params(stdout))
    finals = sorted(re.findall(r"^\[(\d+)\] final (.*) resets (.*)$", stdout, re.M))
    assert finals == [(r, want, "[2]") for r in survivors], (want, stdout)


def test_a_rank_connecting_for_a_generation_that_ended_gives_up_at_once() -> None:
    """A member died just after its generation formed: the others stop waiting for it when the
    endpoint says the generation ended, not after the collective timeout."""
    ports = free_ports(2)
    failed: list[BaseException] = []

    def rank0() -> None:
        try:
            pc.init(
                rank=0,
                size=2,
                peers=[f"127.0.0.1:{p}" for p in ports],
                timeout=60,
                generation=7,
            )
        except pc.CollectiveError as exc:
            failed.append(exc)
        finally:
            pc.shutdown()

    t = threading.Thread(target=rank0)
    started = time.monotonic()
    t.start()
    _core.end_generation(6)  # another generation changes nothing
    t.join(0.3)
    assert t.is_alive(), "rank 0 stopped waiting although its own generation goes on"
    _core.end_generation(7)
    t.join(10)
    assert not t.is_alive(), "rank 0 still connecting 10 s after its generation ended"
    assert time.monotonic() - started < 10
    assert failed and "generation 7 ended while this rank was connecting" in str(failed[0])
    _core.end_generation(0)  # the process's next gang starts afresh
