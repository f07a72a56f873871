"""An elastic trainer for tests/test_rendezvous_ops.py (run under ``peloton-run --elastic``).

The deterministic steps of tests/elastic_train.py (``grad``, integer parameters; rank 0 prints
``applied <step> <size>``). The worker that is rank 2 of a first generation of 3 prints
``term-me <pid>`` after step ``TERM_AT`` and waits until the generation ends (the test sends it
SIGTERM: elastic.run's handler asks the endpoint to drain it), then commits with the others:
the gang re-forms without it, keeping its state. Every worker prints ``exit <code>`` if
elastic.run exits the process, and ``final <params> resets <sizes>`` if training returns.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from elastic_train import DIM, grad

import peloton.collective as pc
from peloton.collective import elastic

STEPS = int(os.environ.get("STEPS", "12"))
TERM_AT = int(os.environ.get("TERM_AT", "6"))
COMMIT_EVERY = int(os.environ.get("COMMIT_EVERY", "3"))


def main() -> None:
    state = elastic.State(params=np.zeros(DIM, dtype=np.int64), step=0)
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(pc.size())])
    first_gen: list[int] = []

    @elastic.run
    def train(state: elastic.State) -> None:
        if not first_gen:
            first_gen.append(pc.rank())
        while state.step < STEPS:
            total = pc.allreduce(
                grad(state.step, pc.rank(), state.params), op="sum", name=f"grad.{state.step}"
            )
            state.params = state.params + total
            if pc.rank() == 0:
                print(f"applied {state.step} {pc.size()}", flush=True)
            state.step += 1
            if state.step == TERM_AT and first_gen == [2] and pc.size() == 3:
                print(f"term-me {os.getpid()}", flush=True)
                assert elastic.wait_for_change(timeout=30.0), "not drained within 30 s"
            if state.step % COMMIT_EVERY == 0 or state.step == STEPS:
                state.commit()

    try:
        train(state)
    except SystemExit as exc:
        print(f"exit {exc.code}", flush=True)
        raise
    print(f"final {' '.join(str(int(x)) for x in state.params)} resets {resets}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
