"""One training trial in one process: the worker of the single-task and sweep examples.

It says what the scheduler gave it (its job, instance and rank, the GPUs in
``CUDA_VISIBLE_DEVICES``, every ``PELOTON_*`` variable), trains the ``make demo`` model
(:mod:`peloton.demo_train`: logistic regression on the seeded synthetic dataset, here all of it
in one process) at one learning rate, and prints the final loss. A sweep's instances each take
their own learning rate from ``--lr-grid`` by ``PELOTON_INSTANCE_ID``. ``--seconds`` paces the
steps to last about that long, a stand-in for a real trial's length that leaves time to watch it
run (``peloton pool tree``, ``peloton task logs``). On SIGTERM (a kill or a preemption) it says
at which step it stopped and exits 143, where a real trial would save a checkpoint.

Run as a task of a peloton job::

    exec python -m peloton.trial --lr 0.5
    exec python -m peloton.trial --lr-grid 0.05,0.1,0.2,0.5 --seconds 120
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import FrameType

from peloton import demo_train

LOG_EVERY = 25


def learning_rate(lr: float, grid: str, instance: int) -> float:
    """The learning rate of instance ``instance``: its entry of the comma-separated ``grid``, or
    ``lr`` without a grid. Raises ValueError when the grid has no entry for it."""
    if not grid:
        return lr
    rates = [float(r) for r in grid.split(",")]
    if not 0 <= instance < len(rates):
        raise ValueError(f"--lr-grid has {len(rates)} rates, none for instance {instance}")
    return rates[instance]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", type=float, default=demo_train.LEARNING_RATE)
    parser.add_argument("--lr-grid", default="", help="Comma-separated: one rate per instance.")
    parser.add_argument("--steps", type=int, default=demo_train.STEPS)
    parser.add_argument("--seconds", type=float, default=0.0, help="Pace the steps over this.")
    args = parser.parse_args(argv)

    instance = int(os.environ.get("PELOTON_INSTANCE_ID", "0"))
    name = f"trial {instance}"
    try:
        lr = learning_rate(args.lr, args.lr_grid, instance)
    except ValueError as exc:
        parser.error(str(exc))
    env = os.environ
    gpus = env.get("CUDA_VISIBLE_DEVICES", "not isolated (CUDA_VISIBLE_DEVICES unset)")
    print(
        f"{name} of job {env.get('PELOTON_JOB_ID', '-')}: rank {env.get('PELOTON_RANK', '0')} "
        f"of {env.get('PELOTON_GANG_SIZE', '1')}, GPUs {gpus}",
        flush=True,
    )
    for key in sorted(k for k in env if k.startswith("PELOTON_")):
        print(f"  {key}={env[key]}", flush=True)

    step_now = 0

    def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
        print(f"{name}: SIGTERM at step {step_now}: stopping", flush=True)
        sys.exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    pause = args.seconds / args.steps if args.steps else 0.0

    def on_step(step: int, loss: float, _shard_loss: float) -> None:
        nonlocal step_now
        step_now = step
        if step % LOG_EVERY == 0 or step == args.steps:
            print(f"{name} lr {lr:g} step {step} loss {loss:.6f}", flush=True)
        if pause and step < args.steps:
            time.sleep(pause)

    x, y = demo_train.make_data()
    result = demo_train.train(x, y, lambda v: v, steps=args.steps, lr=lr, on_step=on_step)
    print(f"{name} done: lr {lr:g}, final loss {result.loss:.6f}", flush=True)


if __name__ == "__main__":
    main()
