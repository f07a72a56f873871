"""peloton: a GPU gang scheduler for distributed deep learning on Apache Mesos."""

from __future__ import annotations

__version__ = "0.1.0"


def report(step: int, **metrics: float) -> bool:
    """Report a sweep trial's metrics at ``step`` to the daemon (README "Sweeps"); True when
    the trial should stop. See :func:`peloton.sweep.report.report`."""
    # Imported here: `import peloton` stays light (task containers import the collective
    # runtime without grpc).
    from peloton.sweep.report import report as send

    return send(step, metrics)
