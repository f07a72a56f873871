"""The fixtures of tests/mesos (defined in mesos_support.py): ``real_cluster``, ``mesos``,
``local_cluster``, ``make_peloton`` and ``peloton``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mesos_support import (  # noqa: F401
    fixture_real_cluster,
    local_cluster,
    make_peloton,
    mesos,
    peloton,
)

PARENT = Path(__file__).resolve().parents[1] / "conftest.py"


def _give_the_name_back(config: pytest.Config) -> None:
    """pytest imports every conftest.py as the module ``conftest``: once this one is loaded,
    ``from conftest import ...`` in tests/*.py (collected after tests/mesos) would find it instead
    of tests/conftest.py. Point the name back at that one (pytest holds this module itself, and
    the modules here import mesos_support, never conftest)."""
    for plugin in config.pluginmanager.get_plugins():
        if Path(getattr(plugin, "__file__", None) or "/").resolve() == PARENT:
            sys.modules["conftest"] = plugin


def pytest_configure(config: pytest.Config) -> None:
    # Called once this conftest is registered (after pytest has checked the import), whether it
    # was loaded at startup or during collection.
    _give_the_name_back(config)
