"""The sweeps' Prometheus metrics: trials by state (read at scrape time), the best objective
of each running sweep, trials stopped early, and reallocations."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from peloton.metrics import StateCounts
from peloton.storage.sweeps import TRIAL_STATES


class SweepMetrics:
    """``peloton_sweep_trials{state}``, ``peloton_sweep_best_objective{sweep_id}``,
    ``peloton_sweep_trials_stopped_total{rule}``, ``peloton_sweep_reallocations_total``."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        trials: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        registry = registry or CollectorRegistry()
        if trials is not None:
            registry.register(
                StateCounts(
                    "peloton_sweep_trials", "Sweep trials by state.", trials, list(TRIAL_STATES)
                )
            )
        self.best = Gauge(
            "peloton_sweep_best_objective",
            "The best objective a running sweep's trials reported so far.",
            ["sweep_id"],
            registry=registry,
        )
        self.stopped = Counter(
            "peloton_sweep_trials_stopped",
            "Trials stopped early, by the rule that stopped them.",
            ["rule"],
            registry=registry,
        )
        self.reallocations = Counter(
            "peloton_sweep_reallocations",
            "Times freed GPUs grew a leading elastic trial.",
            registry=registry,
        )
