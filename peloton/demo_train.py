"""The ``make demo`` worker: data-parallel logistic regression with :mod:`peloton.collective`.

Every rank builds the same seeded synthetic dataset, keeps its own equal shard, and runs full-batch
gradient descent; the shard gradients are averaged with ``allreduce(op="average")`` each step.
Shards are equal in size, so the average of the shard gradients is the gradient on the whole
dataset: a gang of any size ends with the parameters one process gets on all the data (up to
floating-point summation order). :func:`train` holds the maths and takes the averaging as an
argument, so a test can run it in one process and compare.

Run as a task of a peloton job (the scheduler sets the PELOTON_* environment)::

    exec python -m peloton.demo_train --out /tmp/demo-out
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
Average = Callable[[Array], Array]

SAMPLES = 4096  # divisible by every gang size the demo and tests use
FEATURES = 8
STEPS = 300
LEARNING_RATE = 0.5
LOG_EVERY = 25


@dataclass(frozen=True)
class Result:
    weights: Array  # FEATURES weights followed by the bias
    loss: float  # mean log loss over the whole dataset at the final weights


def make_data(samples: int = SAMPLES, seed: int = 0) -> tuple[Array, Array]:
    """Points in FEATURES dimensions labelled by a hidden linear rule, with 5% of labels flipped
    so the optimum is finite."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, FEATURES))
    true_w = rng.normal(size=FEATURES)
    y = (x @ true_w + 0.3 > 0).astype(np.float64)
    flip = rng.random(samples) < 0.05
    y[flip] = 1.0 - y[flip]
    return x, y


def shard(x: Array, y: Array, rank: int, size: int) -> tuple[Array, Array]:
    """Rank ``rank``'s contiguous slice of ``size`` equal slices."""
    if len(x) % size:
        raise ValueError(f"{len(x)} samples do not split into {size} equal shards")
    n = len(x) // size
    return x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]


def loss_and_grad(w: Array, x: Array, y: Array) -> tuple[float, Array]:
    """Mean log loss of weights ``w`` (bias last) on (``x``, ``y``), and its gradient."""
    xb = np.hstack([x, np.ones((len(x), 1))])
    z = xb @ w
    p = 1.0 / (1.0 + np.exp(-z))
    # log(1 + e^z) - y z, written stably for large |z|.
    loss = float(np.mean(np.logaddexp(0.0, z) - y * z))
    grad = xb.T @ (p - y) / len(x)
    return loss, grad


def train(
    x: Array,
    y: Array,
    average: Average,
    *,
    steps: int = STEPS,
    lr: float = LEARNING_RATE,
    on_step: Callable[[int, float, float], None] | None = None,
) -> Result:
    """Gradient descent from zero weights on (``x``, ``y``); ``average`` combines each step's
    [loss, gradient] vector across ranks (the identity for one process). ``on_step`` gets each
    step's number, loss over all ranks' data, and loss over this rank's own data."""
    w = np.zeros(x.shape[1] + 1)
    loss = 0.0
    for step in range(steps + 1):
        local_loss, grad = loss_and_grad(w, x, y)
        # One allreduce per step carries the loss along with the gradient.
        combined = average(np.concatenate([[local_loss], grad]))
        loss = float(combined[0])
        if on_step is not None:
            on_step(step, loss, local_loss)
        if step < steps:
            w = w - lr * combined[1:]
    return Result(w, loss)


def main(argv: list[str] | None = None) -> None:
    import peloton.collective as pc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="Where rank-N.json goes.")
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args(argv)

    pc.init()
    try:
        rank, size = pc.rank(), pc.size()
        x, y = shard(*make_data(), rank, size)

        def report(step: int, loss: float, shard_loss: float) -> None:
            if step % LOG_EVERY == 0 or step == args.steps:
                print(
                    f"rank {rank}/{size} step {step} loss {loss:.6f} shard loss {shard_loss:.6f}",
                    flush=True,
                )

        result = train(
            x, y, lambda v: pc.allreduce(v, op="average"), steps=args.steps, on_step=report
        )
    finally:
        pc.shutdown()
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "size": size, "weights": result.weights.tolist(), "loss": result.loss}
    (args.out / f"rank-{rank}.json").write_text(json.dumps(record))
    print(f"rank {rank} done: final loss {result.loss:.6f}", flush=True)


if __name__ == "__main__":
    main()
