"""A local cluster that speaks the Mesos v1 scheduler HTTP API: a master and agents that run
tasks as real processes (or simulated ones), for development, tests and benchmarks.

See :class:`Minicluster`; ``peloton minicluster up`` runs one in the foreground.
"""

from peloton.minicluster.agent import SIM_DURATION_ENV, SIM_EXIT_CODE_ENV
from peloton.minicluster.cluster import Minicluster
from peloton.minicluster.master import FrameworkView, TaskView
from peloton.minicluster.spec import AgentSpec

__all__ = [
    "SIM_DURATION_ENV",
    "SIM_EXIT_CODE_ENV",
    "AgentSpec",
    "FrameworkView",
    "Minicluster",
    "TaskView",
]
