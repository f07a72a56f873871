"""Elastic gangs: the rendezvous protocol, generations in the runtime, and a gang that loses a
rank under ``peloton-run --elastic`` and finishes with exactly what its committed steps imply."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
from collective_support import free_ports
from elastic_train import DIM, grad

import peloton.collective as pc
from peloton.collective import _core, elastic
from peloton.collective.rendezvous import (
    Membership,
    RendezvousClient,
    RendezvousError,
    RendezvousServer,
)
from peloton.core.gangenv import GangEnv

RUN = [sys.executable, "-m", "peloton.collective.run"]
TRAINER = str(Path(__file__).with_name("elastic_train.py"))
DEADLINE_S = 60.0
T = TypeVar("T")


def in_threads(*calls: Callable[[], T]) -> list[T]:
    """Runs the calls at once; their results in order (a failure is re-raised)."""
    results: list[T | BaseException | None] = [None] * len(calls)

    def one(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # handed to the test below
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
        assert not t.is_alive(), f"a call still running after {DEADLINE_S} s: {calls}"
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


def client(server: RendezvousServer, name: str, timeout: float = 10.0) -> RendezvousClient:
    return RendezvousClient(server.address, server.token, name, timeout)


def join(c: RendezvousClient, port: int) -> Callable[[], Membership]:
    return lambda: c.join(f"127.0.0.1:{port}")


def test_generations_increase_and_survivors_keep_their_order() -> None:
    with RendezvousServer("secret", 2, 3, expect=3) as server:
        a, b, c = (client(server, n) for n in "abc")
        first = in_threads(join(a, 1001), join(b, 1002), join(c, 1003))
        assert [m.generation for m in first] == [1, 1, 1]
        assert sorted(m.rank for m in first) == [0, 1, 2]
        assert first[0].members == ("127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003")
        # The member of rank 1 dies: its session drops, the generation ends for the others.
        dead = [a, b, c][[m.rank for m in first].index(1)]
        dead.close()
        alive = [x for x in (a, b, c) if x is not dead]
        assert all(x.watch(1, timeout=10.0) for x in alive)
        second = in_threads(join(alive[0], 2001), join(alive[1], 2002))
        assert [m.generation for m in second] == [2, 2]
        assert [m.size for m in second] == [2, 2]
        # Survivors keep their relative order: old rank 0 stays rank 0 (its state is synced).
        old_ranks = [first[(a, b, c).index(x)].rank for x in alive]
        assert [m.rank for m in second] == [sorted(old_ranks).index(r) for r in old_ranks]


def test_a_worker_joining_ends_the_generation_and_the_next_takes_it_in() -> None:
    with RendezvousServer("secret", 2, 3, expect=2) as server:
        a, b = client(server, "a"), client(server, "b")
        assert [m.size for m in in_threads(join(a, 1), join(b, 2))] == [2, 2]
        assert not a.closed(1)
        c = client(server, "c")
        got = in_threads(
            join(c, 3),
            lambda: a.watch(1, 10.0) and a.join("127.0.0.1:4"),
            lambda: b.watch(1, 10.0) and b.join("127.0.0.1:5"),
        )
        assert [(m.generation, m.size) for m in got] == [(2, 3)] * 3
        assert got[0].rank == 2  # the newcomer is never rank 0


def test_the_gang_never_exceeds_max() -> None:
    with RendezvousServer("secret", 1, 2, expect=2) as server:
        a, b = client(server, "a"), client(server, "b")
        assert [m.size for m in in_threads(join(a, 1), join(b, 2))] == [2, 2]


def test_a_wrong_token_is_refused() -> None:
    with (
        RendezvousServer("secret", 1, 1, expect=1) as server,
        pytest.raises(RendezvousError, match="wrong token"),
    ):
        RendezvousClient(server.address, "guess", "a", 5.0)


def test_below_min_is_an_error_naming_the_minimum_and_the_timeout() -> None:
    with RendezvousServer("secret", 2, 2, expect=2) as server:
        lonely = client(server, "a", timeout=0.5)
        start = time.monotonic()
        with pytest.raises(RendezvousError, match=r"min=2 workers formed within 0.5 s"):
            lonely.join("127.0.0.1:1")
        assert time.monotonic() - start < 5.0


def test_a_rank_of_a_stale_generation_is_refused_at_once_on_both_sides() -> None:
    ports = free_ports(2)
    hosts = ["127.0.0.1"] * 2

    def rank(r: int, generation: int) -> Callable[[], str]:
        def connect() -> str:
            try:
                _core.Runtime(r, 2, hosts, ports, 20.0, 1 << 20, generation=generation)
            except _core.CollectiveError as exc:
                return str(exc)
            return "connected"

        return connect

    start = time.monotonic()
    errors = in_threads(rank(0, 2), rank(1, 1))
    elapsed = time.monotonic() - start
    assert "rank 0 of generation 2: rank 1 is of generation 1" in errors[0], errors
    assert "rank 1 of generation 1: rank 0 is of generation 2" in errors[1], errors
    assert elapsed < 10.0, f"refusing a stale rank took {elapsed:.1f} s (timeout 20 s)"


def expected_params(rank0_stdout: str) -> np.ndarray:
    """Replays the steps rank 0 applied, each at the size it was last applied with (a step
    redone after a restore replaces the rolled-back one)."""
    size_of: dict[int, int] = {}
    for step, size in re.findall(r"^\[\d+\] applied (\d+) (\d+)$", rank0_stdout, re.M):
        size_of[int(step)] = int(size)
    params = np.zeros(DIM, dtype=np.int64)
    for step in sorted(size_of):
        params = params + sum(grad(step, r, params) for r in range(size_of[step]))
    return params


def elastic_run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *RUN,
            "--elastic",
            *args,
            "env",
            *(f"{k}={v}" for k, v in env.items()),
            sys.executable,
            TRAINER,
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )


def test_survivors_of_a_sigkill_restore_the_last_commit_and_finish_at_the_smaller_size() -> None:
    proc = elastic_run(
        "--min",
        "2",
        "--max",
        "3",
        "-np",
        "3",
        env={"STEPS": "12", "KILL_AT": "7", "COMMIT_EVERY": "3"},
    )
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, out + err
    print(err)
    killed = re.findall(r"^\[(\d+)\] killed ([\d.]+)$", out, re.M)
    assert len(killed) == 1, out
    victim = killed[0][0]
    survivors = sorted({r for r in re.findall(r"^\[(\d+)\] final", out, re.M)})
    assert len(survivors) == 2 and victim not in survivors, out
    # Each rank logs its generations: 1 at size 3, then 2 at size 2 after the loss.
    for r in survivors:
        gens = re.findall(
            rf"^\[{r}\] peloton.elastic: generation (\d+): rank \d of (\d)$", err, re.M
        )
        assert gens == [("1", "3"), ("2", "2")], err
    # Step 6 was applied at size 3 and not committed: it is redone at size 2.
    applied = re.findall(r"^\[\d+\] applied (\d+) (\d+)$", out, re.M)
    assert ("6", "3") in applied and ("6", "2") in applied and ("11", "2") in applied, out
    want = " ".join(str(int(x)) for x in expected_params(out))
    finals = re.findall(r"^\[\d+\] final (.*) resets (.*)$", out, re.M)
    assert finals == [(want, "[2]")] * 2, (want, out)
    resumed = [float(t) for t in re.findall(r"^\[\d+\] resumed ([\d.]+) size 2$", out, re.M)]
    print(
        f"recovery: {min(resumed) - float(killed[0][1]):.3f} s from SIGKILL to the first "
        "allreduce at the new size"
    )


def test_below_min_for_longer_than_the_timeout_fails_the_gang_with_the_reason() -> None:
    proc = elastic_run(
        "--min", "3", "--max", "3", "-np", "3", env={"KILL_AT": "4", "PELOTON_ELASTIC_TIMEOUT": "1"}
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert proc.stderr.count("no generation of at least min=3 workers formed within 1 s") == 2, (
        proc.stderr
    )
    assert "final" not in proc.stdout


def test_a_worker_joining_a_running_gang_is_taken_in_and_the_state_is_kept() -> None:
    formed = threading.Event()

    def log(line: str) -> None:
        if line.startswith("generation 1:"):
            formed.set()

    env = {**os.environ, "STEPS": "9", "GROW_AT": "4", "COMMIT_EVERY": "100"}
    with RendezvousServer("secret", 2, 3, expect=2, log=log) as server:
        env |= {"PELOTON_RENDEZVOUS": server.address, "PELOTON_RENDEZVOUS_TOKEN": "secret"}

        def start() -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, TRAINER],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )

        workers = [start(), start()]
        try:
            assert formed.wait(DEADLINE_S), "generation 1 did not form"
            workers.append(start())
            outs = [w.communicate(timeout=DEADLINE_S) for w in workers]
        finally:
            for w in workers:
                w.kill()
    for w, (out, err) in zip(workers, outs, strict=True):
        assert w.returncode == 0, out + err
    rank0 = next(out for out, _ in outs if "applied 0 2" in out)
    # Steps 0-3 at size 2; the gang re-forms at 3 keeping them (no restore), then 4-8 at size 3.
    applied = re.findall(r"^applied (\d+) (\d+)$", rank0, re.M)
    assert applied == [(str(s), "2" if s < 4 else "3") for s in range(9)], rank0
    replay = "\n".join(f"[0] applied {s} {n}" for s, n in applied)
    want = " ".join(str(int(x)) for x in expected_params(replay))
    finals = [re.findall(r"^final (.*) resets", out, re.M) for out, _ in outs]
    assert finals == [[want]] * 3, (want, outs)
    assert all("state kept" in err for _, err in outs[:2]), outs


def test_torch_state_restores_the_model_optimizer_and_values_of_the_last_commit() -> None:
    torch = pytest.importorskip("torch")
    from peloton.collective.torch import TorchState

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TorchState(model, opt, epoch=1)

    def step() -> None:
        opt.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        opt.step()

    step()
    state.epoch = 2
    state.commit()  # outside elastic.run: no membership to check
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    step()
    state.epoch = 3
    state.restore()
    assert state.epoch == 2
    assert all(torch.equal(committed[k], v) for k, v in model.state_dict().items())
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], momentum)


def test_a_failure_while_re_forming_after_a_graceful_change_keeps_the_state_it_stopped_at(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker joins a gang of 1 that took 3 uncommitted steps: the gang stops at step 3 (state
    kept); the generation that takes the newcomer in fails while connecting (the newcomer leaves
    at once); the next one, alone again, goes on from step 3, not from the last commit (0)."""
    real_init = pc.init

    def init(**kwargs: object) -> None:
        if kwargs["generation"] == 2:
            raise pc.CollectiveError("rank 1 is gone while generation 2 connects")
        real_init(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pc, "init", init)
    with RendezvousServer("secret", 1, 2, expect=1) as server:
        monkeypatch.setenv("PELOTON_RENDEZVOUS", server.address)
        monkeypatch.setenv("PELOTON_RENDEZVOUS_TOKEN", "secret")

        def come_and_go() -> None:
            newcomer = client(server, "newcomer")  # a session: the endpoint waits for it
            newcomer.join("127.0.0.1:1")  # returns once generation 2 formed with it
            newcomer.leave()

        starts: list[tuple[int, int]] = []

        @elastic.run
        def train(state: elastic.State) -> int:
            starts.append((elastic.membership().generation, state.step))  # type: ignore[union-attr]
            if state.step == 0:
                state.step = 3  # three steps, not committed
                threading.Thread(target=come_and_go, daemon=True).start()
                assert elastic.wait_for_change(DEADLINE_S), "the newcomer did not end generation 1"
                state.check_host_updates()  # raises HostsUpdatedInterrupt
            return state.step

        assert train(elastic.State(step=0)) == 3
    assert starts == [(1, 0), (3, 3)], starts


def test_a_generation_s_layout_wins_over_the_variables_of_the_launch() -> None:
    """A scheduled task's PELOTON_CROSS_* describe the layout it was launched in (here: 2 hosts);
    elastic.run passes each generation's own (3 ranks on one host), which must win, or the ranks
    disagree on shared memory and the generation never forms."""
    launched = {"PELOTON_RANK": "1", "PELOTON_GANG_SIZE": "3", "PELOTON_CROSS_RANK": "1",
                "PELOTON_CROSS_SIZE": "2", "PELOTON_PEERS": "a:1,a:2,b:3"}  # fmt: skip
    topo = GangEnv.from_env(
        launched, rank=2, size=3, peers=["h:1", "h:2", "h:3"], local_rank=2, local_size=3,
        cross_rank=0, cross_size=1,
    )  # fmt: skip
    assert (topo.rank, topo.local_rank, topo.local_size, topo.cross_rank, topo.cross_size) == (
        2, 2, 3, 0, 1,
    )  # fmt: skip
    assert GangEnv.from_env(launched).cross_size == 2  # without them, the variables


def test_a_signal_another_thread_receives_is_handled_while_watching() -> None:
    # A SIGTERM the kernel hands to one of the runtime's threads must still drain the worker
    # that waits in watch() (its handler runs on the main thread, between slices of the wait).
    with RendezvousServer("secret", 1, 2, expect=1) as server:
        c = client(server, "a")
        assert c.join("127.0.0.1:1").generation == 1
        parked = threading.Event()
        other = threading.Thread(target=parked.wait, daemon=True)
        other.start()
        previous = signal.signal(signal.SIGUSR1, lambda *_: c.request_drain("SIGUSR1"))
        try:
            assert other.ident is not None
            timer = threading.Timer(0.2, signal.pthread_kill, (other.ident, signal.SIGUSR1))
            timer.start()
            began = time.monotonic()
            assert c.watch(1, timeout=20.0)
            assert time.monotonic() - began < 10.0
        finally:
            signal.signal(signal.SIGUSR1, previous)
            parked.set()
            c.close()
