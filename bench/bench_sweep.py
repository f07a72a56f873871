"""Sweep benchmark (simulated): GPU-hours to reach a target objective with ASHA and GPUs that
follow results, against random search whose trials all run to completion, same seed, one run.

Run from the repository root::

    .venv/bin/python -m bench.bench_sweep [--trials 32] [--seed 7] [--target 0.13]

Both sweeps draw the same trials (peloton's :class:`~peloton.sweep.search.RandomSearch` over
the example's space, ``examples/sweep/lr-sweep.yaml``) and train them on a simulated clock with
the example trainer's loss curve, ``floor(lr, width) + 2 exp(-step / 4)``, 27 steps each. A step
costs one GPU-unit of work: a gang of ``n`` tasks takes ``1 / (n * EFFICIENCY)`` time units per
step above one task (data-parallel scaling at ``EFFICIENCY``), one unit on one. Both sweeps run
``--parallel`` trials at once.

* **random to completion**: one GPU per trial, every trial runs its 27 steps.
* **ASHA + reallocation**: the sweep controller's rules with its own pure parts: ASHA
  (:class:`~peloton.sweep.stopping.Asha`, rungs at 3, 9 of 27, eta 3) stops trials as they
  report, a stopped trial's GPU starts the next trial, and once ``--parallel`` trials run and
  all of them reported, the budget's spare GPUs (``--budget``) grow the leading elastic trials
  up to 2 tasks (:func:`~peloton.sweep.realloc.plan_growth`).

The figure is the GPU-time (GPUs held, integrated over the clock; a unit is one GPU-hour if a
step takes an hour on one GPU) until a trial first reports a loss at or below ``--target``,
and the same to the end of the sweep, with the steps reported. Pure Python, no daemon: it
measures the policy, not peloton's overheads (tests/test_sweep_e2e.py runs the real thing).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field

from peloton.sweep.realloc import Running, plan_growth
from peloton.sweep.search import RandomSearch
from peloton.sweep.space import IntRange, LogUniform, Space
from peloton.sweep.stopping import Asha

SPACE: Space = {"lr": LogUniform(0.001, 1.0), "width": IntRange(1, 4)}
STEPS = 27
EFFICIENCY = 0.9
TICK = 0.01  # time units per simulation tick


def loss(lr: float, width: int, step: int) -> float:
    """The example trainer's loss (examples/sweep/sweep_train.py)."""
    floor = 0.1 + 0.5 * math.log10(lr / 0.1) ** 2 + 0.02 * (4 - width)
    return floor + 2.0 * math.exp(-step / 4)


@dataclass
class Trial:
    index: int
    lr: float
    width: int
    size: int = 1
    progress: float = 0.0  # steps done, fractional
    history: list[tuple[int, float]] = field(default_factory=list)

    def rate(self) -> float:
        return 1.0 if self.size == 1 else self.size * EFFICIENCY


@dataclass
class Outcome:
    gpu_time_to_target: float | None
    time_to_target: float | None
    gpu_time: float
    steps: int
    stopped: int
    reallocations: int
    best: float


def simulate(
    trials: int, seed: int, parallel: int, budget: int, target: float, early: bool
) -> Outcome:
    """One sweep on the simulated clock (see the module doc)."""
    search = RandomSearch(SPACE, seed)
    asha = Asha(3, STEPS, 3)
    histories: dict[str, list[tuple[int, float]]] = {}
    running: list[Trial] = []
    started = stopped = steps = reallocations = 0
    clock = gpu_time = 0.0
    hit: tuple[float, float] | None = None
    best = math.inf
    while True:
        while len(running) < parallel and started < trials:
            s = search.suggest(started)
            assert s is not None
            t = Trial(started, float(s.params["lr"]), int(s.params["width"]))
            histories[str(t.index)] = t.history
            running.append(t)
            started += 1
        if not running:
            break
        if early and all(t.history for t in running):  # the controller's rule: all reported
            held = sum(t.size for t in running)
            grows = plan_growth(
                [
                    Running(str(t.index), t.size, 2, 1.0, min(v for _, v in t.history))
                    for t in running
                ],
                budget - held,
            )
            for t in running:
                if str(t.index) in grows:
                    t.size = grows[str(t.index)]
                    reallocations += 1
        gpu_time += sum(t.size for t in running) * TICK
        clock += TICK
        for t in list(running):
            before = int(t.progress)
            t.progress = min(STEPS, t.progress + t.rate() * TICK)
            for step in range(before + 1, int(t.progress) + 1):
                value = loss(t.lr, t.width, step)
                t.history.append((step, value))
                steps += 1
                best = min(best, value)
                if hit is None and value <= target:
                    hit = (gpu_time, clock)
            if int(t.progress) >= STEPS:
                running.remove(t)
            elif early and int(t.progress) > before and asha.stop(str(t.index), histories):
                running.remove(t)
                stopped += 1
    return Outcome(
        gpu_time_to_target=None if hit is None else round(hit[0], 2),
        time_to_target=None if hit is None else round(hit[1], 2),
        gpu_time=round(gpu_time, 2),
        steps=steps,
        stopped=stopped,
        reallocations=reallocations,
        best=round(best, 4),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--budget", type=int, default=6, help="GPUs of the ASHA sweep")
    parser.add_argument("--target", type=float, default=0.13)
    args = parser.parse_args()
    common = (args.trials, args.seed, args.parallel)
    baseline = simulate(*common, budget=args.parallel, target=args.target, early=False)
    asha = simulate(*common, budget=args.budget, target=args.target, early=True)
    print(json.dumps({"random_to_completion": vars(baseline), "asha_realloc": vars(asha)}))
    print("| | random to completion | ASHA + reallocation |\n|---|---|---|")
    for name in (
        "gpu_time_to_target",
        "time_to_target",
        "gpu_time",
        "steps",
        "stopped",
        "reallocations",
        "best",
    ):
        print(f"| {name} | {getattr(baseline, name)} | {getattr(asha, name)} |")


if __name__ == "__main__":
    main()
