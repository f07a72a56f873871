"""The job of one trial: the sweep's template with the trial's parameters and what its
workers report with. No I/O.

A trial's tasks get, on top of the template's environment (``SWEEP_*``: ``PELOTON_*`` names are
the scheduler's own, which a job spec may not set):

- ``SWEEP_PARAM_<NAME>``: each parameter (``SWEEP_PARAM_LR=0.01``); ``{name}`` in the
  task's command is replaced by it too (``--lr {lr}``).
- ``SWEEP_SERVER``: the daemon's gRPC address, where :func:`peloton.report` sends, and
  ``SWEEP_SERVER_TLS=1`` where the daemon serves TLS (the tasks verify its certificate with the
  CA in ``SWEEP_CA_FILE`` when their template sets one, else the system's roots).
- ``SWEEP_ID``, ``SWEEP_TRIAL``: which sweep and trial (its index) this is.
- ``SWEEP_TOKEN``: the trial's report token, which the daemon requires of every
  report: only the trial's own tasks (and whoever may read its job) hold it.
"""

from __future__ import annotations

from collections.abc import Mapping

from peloton.sweep.space import Value
from peloton.v1 import job_pb2

PARAM_PREFIX = "SWEEP_PARAM_"
SWEEP_SERVER = "SWEEP_SERVER"
SWEEP_SERVER_TLS = "SWEEP_SERVER_TLS"
SWEEP_ID = "SWEEP_ID"
TRIAL_INDEX = "SWEEP_TRIAL"
SWEEP_TOKEN = "SWEEP_TOKEN"
# Labels every trial job carries (peloton job list --label sweep=ID).
SWEEP_LABEL = "sweep"
TRIAL_LABEL = "trial"


def text(value: Value) -> str:
    """A parameter as its tasks see it (a float in its shortest exact form)."""
    return repr(value) if isinstance(value, float) else str(value)


def trial_job(
    template: job_pb2.JobSpec,
    sweep_name: str,
    sweep_id: str,
    index: int,
    params: Mapping[str, Value],
    token: str,
    server: str,
    tls: bool = False,
) -> job_pb2.JobSpec:
    """The job spec of trial ``index`` (the template is left as it is); ``tls``: the daemon
    at ``server`` serves TLS."""
    spec = job_pb2.JobSpec()
    spec.CopyFrom(template)
    spec.name = f"{sweep_name}-trial-{index}"
    spec.labels[SWEEP_LABEL] = sweep_id
    spec.labels[TRIAL_LABEL] = str(index)
    env = spec.task.env
    command = spec.task.command
    for name, value in sorted(params.items()):
        env[PARAM_PREFIX + name.upper()] = text(value)
        command = command.replace("{" + name + "}", text(value))
    spec.task.command = command
    env[SWEEP_SERVER] = server
    if tls:
        env[SWEEP_SERVER_TLS] = "1"
    env[SWEEP_ID] = sweep_id
    env[TRIAL_INDEX] = str(index)
    env[SWEEP_TOKEN] = token
    return spec
