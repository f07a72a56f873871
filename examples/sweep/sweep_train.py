"""The trainer of the sweep example (examples/sweep/lr-sweep.yaml): a small deterministic
training run whose loss depends on its hyperparameters in a known way, so that a sweep can be
checked to find the best region.

Its loss at step ``s`` is ``floor + 2 exp(-s / 4)``, where the floor is lowest (0.1) at
``--lr 0.1 --width 4``: ``0.1 + 0.5 log10(lr / 0.1)^2 + 0.02 (4 - width)``. The best region is
``lr`` between 0.03 and 0.3. Each step takes ``--step-seconds`` and is reported with
:func:`peloton.report` (rank 0 only: instance 0 of the elastic gang; the ranks it grows into
take part in nothing here and wait to be stopped when the trial ends). A trial told to stop
(early stopping, or its sweep ended) exits at once.

Runs alone too (``python examples/sweep/sweep_train.py --lr 0.1``): then it only prints.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import peloton


def loss(lr: float, width: int, step: int) -> float:
    """The loss of a trial with these hyperparameters after ``step`` steps."""
    floor = 0.1 + 0.5 * math.log10(lr / 0.1) ** 2 + 0.02 * (4 - width)
    return floor + 2.0 * math.exp(-step / 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--steps", type=int, default=27)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    args = parser.parse_args()
    if os.environ.get("PELOTON_INSTANCE_ID", "0") != "0":
        # A rank the elastic gang grew into: it holds its GPU until the trial ends.
        print("grown into: waiting for the trial to end", flush=True)
        while True:
            time.sleep(60)
    for step in range(1, args.steps + 1):
        time.sleep(args.step_seconds)
        value = loss(args.lr, args.width, step)
        print(f"step {step} loss {value:.6f}", flush=True)
        if peloton.report(step=step, loss=value):
            print(f"told to stop at step {step}", flush=True)
            return
    print(f"done: lr {args.lr:g} width {args.width} loss {value:.6f}", flush=True)


if __name__ == "__main__":
    main()
