"""A sweep spec's checks, and what it says in the terms of :mod:`peloton.sweep`: its search
space, its early-stopping rule, its limits. No I/O, no clock.

Every refusal is an InvalidArgument naming the field (``space.lr.low``, ``max_trials``).
"""

from __future__ import annotations

from dataclasses import dataclass

from peloton.core.spec import DEFAULT_POOL, is_elastic, with_defaults
from peloton.errors import InvalidArgument
from peloton.sweep.search import DEFAULT_GRID_POINTS
from peloton.sweep.space import Choice, IntRange, LogUniform, Param, Space, Uniform, check_space
from peloton.sweep.stopping import Asha, MedianStopping
from peloton.v1 import sweep_pb2

BUILT_IN = ("random", "grid")
# Optuna's samplers a sweep may name (peloton.sweep.optuna_search).
OPTUNA = ("tpe", "qmc")
ALGORITHMS = BUILT_IN + OPTUNA
DEFAULT_ETA = 3
DEFAULT_MIN_TRIALS = 3
MAX_TRIALS = 10_000

Stopping = Asha | MedianStopping | None


@dataclass(frozen=True)
class Plan:
    """A checked sweep spec, in the sweep package's terms."""

    space: Space
    algorithm: str
    maximize: bool
    stopping: Stopping
    parallel: int
    budget_gpus: float
    gpus_per_task: float
    min_size: int
    max_size: int
    grid_points: int


def choice_value(text: str) -> int | float | str:
    """A choice as a trial gets it: an int or a float where the text is one, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def param_from_pb(param: sweep_pb2.Param, field: str) -> Param:
    kind = param.WhichOneof("kind")
    if kind == "uniform":
        return Uniform(param.uniform.low, param.uniform.high)
    if kind == "log_uniform":
        return LogUniform(param.log_uniform.low, param.log_uniform.high)
    if kind == "int":
        low, high = param.int.low, param.int.high
        if low != int(low) or high != int(high):
            raise InvalidArgument(f"{field}.int", "low and high must be whole numbers")
        return IntRange(int(low), int(high))
    if kind == "choice":
        return Choice(tuple(choice_value(v) for v in param.choice.values))
    raise InvalidArgument(field, "give one of uniform, log_uniform, int, choice")


def space_from_pb(spec: sweep_pb2.SweepSpec) -> Space:
    space = {name: param_from_pb(p, f"space.{name}") for name, p in spec.space.items()}
    check_space(space)
    return space


def stopping_from_pb(spec: sweep_pb2.SweepSpec) -> Stopping:
    es = spec.early_stopping
    rule = es.WhichOneof("rule")
    if rule == "asha":
        a = es.asha
        if a.min_step < 1:
            raise InvalidArgument("early_stopping.asha.min_step", "must be at least 1")
        if a.max_step < a.min_step:
            raise InvalidArgument(
                "early_stopping.asha.max_step", f"{a.max_step} is below min_step {a.min_step}"
            )
        if a.eta == 1:
            raise InvalidArgument("early_stopping.asha.eta", "must be at least 2")
        return Asha(a.min_step, a.max_step, a.eta or DEFAULT_ETA)
    if rule == "median":
        return MedianStopping(es.median.grace_steps, es.median.min_trials or DEFAULT_MIN_TRIALS)
    return None


def plan(spec: sweep_pb2.SweepSpec) -> Plan:
    """Check ``spec`` (its trial job's own checks are the job manager's, at each trial)."""
    if not spec.name:
        raise InvalidArgument("name", "is required")
    if not spec.HasField("trial"):
        raise InvalidArgument("trial", "is required: the job every trial runs")
    if not spec.objective.metric:
        raise InvalidArgument("objective.metric", "is required: the metric trials report")
    algorithm = spec.algorithm or "random"
    if algorithm not in ALGORITHMS:
        raise InvalidArgument("algorithm", f"unknown {algorithm!r}; one of {', '.join(ALGORITHMS)}")
    if not 1 <= spec.max_trials <= MAX_TRIALS:
        raise InvalidArgument("max_trials", f"must be 1 to {MAX_TRIALS}")
    parallel = spec.parallel_trials or 1
    if parallel > spec.max_trials:
        raise InvalidArgument(
            "parallel_trials", f"{parallel} is above max_trials {spec.max_trials}"
        )
    space = space_from_pb(spec)
    trial = with_defaults(spec.trial)
    elastic = is_elastic(trial)
    max_size = trial.gang.max_instances if elastic else max(1, trial.instances)
    min_size = max(1, trial.gang.min_instances) if elastic else max_size
    gpus = trial.task.resources.gpu
    budget = spec.budget_gpus or parallel * min_size * gpus
    if budget < min_size * gpus:
        raise InvalidArgument(
            "budget_gpus", f"{budget:g} is below one trial's minimum, {min_size * gpus:g} GPUs"
        )
    return Plan(
        space=space,
        algorithm=algorithm,
        maximize=spec.objective.maximize,
        stopping=stopping_from_pb(spec),
        parallel=parallel,
        budget_gpus=budget,
        gpus_per_task=gpus,
        min_size=min_size,
        max_size=max_size,
        grid_points=spec.grid_points or DEFAULT_GRID_POINTS,
    )


def pool_of(spec: sweep_pb2.SweepSpec) -> str:
    """The sweep's pool: its trial job's."""
    return spec.trial.pool or DEFAULT_POOL
