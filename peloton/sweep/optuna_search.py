"""Optuna's samplers (TPE, QMC) as a sweep's search algorithm, through Optuna's
ask/tell API, with Optuna's storage in peloton's own database.

Each sweep is one Optuna study, ``peloton-sweep-<sweep id>``, minimizing the trials' losses
(:func:`peloton.sweep.stopping.loss_of`). Optuna's tables (``studies``, ``trials``, ...) sit
beside peloton's; peloton's migrations own the ``alembic_version`` table, so Optuna's own
schema check, which reads it, is skipped (the tables are created by the installed Optuna).
A trial's Optuna number is stored with it: a daemon that restarts tells Optuna the results of
the trials it asked for before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from peloton.sweep.search import Suggestion
from peloton.sweep.space import Choice, IntRange, LogUniform, Param, Space, Uniform

# SQLite: how long Optuna waits for the database's lock (peloton's writers hold it briefly).
SQLITE_LOCK_SECONDS = 30

_SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "tpe": lambda seed: optuna.samplers.TPESampler(seed=seed),
    "qmc": lambda seed: optuna.samplers.QMCSampler(seed=seed),
}


def distribution(param: Param) -> BaseDistribution:
    """Optuna's distribution of a search-space parameter."""
    if isinstance(param, Uniform):
        return FloatDistribution(param.low, param.high)
    if isinstance(param, LogUniform):
        return FloatDistribution(param.low, param.high, log=True)
    if isinstance(param, IntRange):
        return IntDistribution(param.low, param.high)
    assert isinstance(param, Choice)
    return CategoricalDistribution(param.values)


def storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's storage in the database at ``url`` (peloton's), through peloton's drivers."""
    parsed = make_url(url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg2")
    sqlite = parsed.drivername.startswith("sqlite")
    kwargs = {"connect_args": {"timeout": SQLITE_LOCK_SECONDS}} if sqlite else {}
    return optuna.storages.RDBStorage(
        parsed.render_as_string(hide_password=False),
        engine_kwargs=kwargs,
        skip_compatibility_check=True,
    )


class OptunaSearch:
    """A :class:`~peloton.sweep.search.Searcher` asking an Optuna study for each trial."""

    def __init__(self, space: Space, sampler: str, seed: int, url: str, sweep_id: str) -> None:
        optuna.logging.set_verbosity(logging.WARNING)
        self._distributions = {name: distribution(p) for name, p in space.items()}
        self._study = optuna.create_study(
            storage=storage(url),
            sampler=_SAMPLERS[sampler](seed),
            study_name=f"peloton-sweep-{sweep_id}",
            direction="minimize",
            load_if_exists=True,
        )

    def suggest(self, index: int) -> Suggestion | None:
        trial = self._study.ask(self._distributions)
        return Suggestion(dict(trial.params), trial.number)

    def observe(self, ref: int, loss: float | None) -> None:
        if loss is None:
            self._study.tell(ref, state=TrialState.FAIL, skip_if_finished=True)
        else:
            self._study.tell(ref, loss, skip_if_finished=True)
