"""A deterministic elastic trainer for tests/test_collective_elastic.py (run under peloton-run).

Integer parameters, so every result is exact: each step every rank contributes
``grad(step, rank, params)`` and the parameters move by their sum over the gang. Rank 0 prints
``applied <step> <size>`` for each step it applies; the test replays the last size of every step
(a step redone after a restore counts once) and expects exactly these parameters.

``KILL_AT=<step>``: the worker that is rank 2 in generation 1 SIGKILLs itself before its
allreduce of that step, printing ``killed <time>``; survivors print ``resumed <time>`` at their
first allreduce in a later generation. Commits happen every ``COMMIT_EVERY`` steps.
``GROW_AT=<step>``: a gang of 2 waits after that step until a worker joins, then commits (the
commit raises HostsUpdatedInterrupt: the gang re-forms at 3 keeping its state).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import peloton.collective as pc
from peloton.collective import elastic

STEPS = int(os.environ.get("STEPS", "12"))
KILL_AT = int(os.environ.get("KILL_AT", "-1"))
COMMIT_EVERY = int(os.environ.get("COMMIT_EVERY", "3"))
GROW_AT = int(os.environ.get("GROW_AT", "-1"))
DIM = 8


def grad(step: int, rank: int, params: np.ndarray) -> np.ndarray:
    """Depends on the parameters, so a step applied twice or lost changes the result."""
    return (params * (rank + 2) + step * 7 + np.arange(DIM)) % 11 - 5


def main() -> None:
    state = elastic.State(params=np.zeros(DIM, dtype=np.int64), step=0)
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(pc.size())])
    first_gen: list[int] = []

    @elastic.run
    def train(state: elastic.State) -> None:
        if not first_gen:
            first_gen.append(pc.rank())
        resumed = False
        while state.step < STEPS:
            if state.step == KILL_AT and first_gen == [2] and pc.rank() == 2:
                print(f"killed {time.time():.6f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            g = grad(state.step, pc.rank(), state.params)
            total = pc.allreduce(g, op="sum", name=f"grad.{state.step}")
            if resets and not resumed:
                print(f"resumed {time.time():.6f} size {pc.size()}", flush=True)
                resumed = True
            state.params = state.params + total
            if pc.rank() == 0:
                print(f"applied {state.step} {pc.size()}", flush=True)
            state.step += 1
            if state.step == GROW_AT and pc.size() == 2:
                print(f"waiting for a worker at step {state.step}", flush=True)
                assert elastic.wait_for_change(timeout=30.0), "no worker joined in 30 s"
                state.commit()
            if state.step % COMMIT_EVERY == 0 or state.step == STEPS:
                state.commit()

    train(state)
    print(f"final {' '.join(str(int(x)) for x in state.params)} resets {resets}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
