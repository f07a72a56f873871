"""README's "Running on Mesos" runs as written: each of its blocks is used here as it stands (the
agent flags and peloton's configuration on a local real cluster; the command that runs the suite
against an existing master, pointed at one)."""

from __future__ import annotations

import getpass
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from daemon import ROOT
from mesos_support import MASTER_ENV, PelotonFactory, RealClusterFactory, two_agents
from support import make_spec

from peloton.config import load_config_file
from peloton.v1 import job_pb2


def section() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("\n## Running on Mesos\n", 1)[1].split("\n## ", 1)[0]


def blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block of the section."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", section(), flags=re.S | re.M)


def test_every_block_is_checked_here() -> None:
    # agent flags, peloton's configuration, the suite against an existing master
    assert [lang for lang, _ in blocks()] == ["sh", "yaml", "sh"]


@pytest.mark.local_shape
@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_reserved_agent_and_the_role_configuration_run_a_two_gpu_gang(
    real_cluster: RealClusterFactory, make_peloton: PelotonFactory, tmp_path: Path
) -> None:
    (_, agent_flags), (_, config), _ = blocks()
    flags = dict(
        line.split("=", 1)
        for line in shlex.split(agent_flags, comments=True)
        if line.startswith("MESOS_")
    )
    # start.sh takes the agents' resources as --resources; other flags pass as MESOS_* variables.
    resources = flags.pop("MESOS_RESOURCES")
    cluster = real_cluster(agents=1, resources=resources, env=flags)
    config_file = tmp_path / "peloton.yaml"
    config_file.write_text(config)
    # The file's zk:// master stands for the cluster's: --mesos-master (a flag) overrides it.
    peloton = make_peloton(cluster, "--config", str(config_file))
    job_id = peloton.client.create_job(make_spec(2, command="true", gpu=1)).job_id
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    framework = peloton.framework()
    assert framework["roles"] == ["gpu"], framework
    assert framework["user"] == getpass.getuser()  # mesos_user left at its default


@pytest.mark.local_shape
def test_the_suite_runs_against_an_existing_master_as_written(
    real_cluster: RealClusterFactory,
) -> None:
    *_, (_, command) = blocks()
    (line,) = command.strip().splitlines()
    existing = two_agents(real_cluster)
    placeholder = re.search(rf"{MASTER_ENV}=(\S+)", line)
    assert placeholder is not None, line
    line = line.replace(placeholder.group(1), existing.master)
    # -o: whatever the age of the virtualenv's stamp, use the virtualenv that runs this test.
    line = line.replace("make test-mesos", "make -o .venv/.installed test-mesos")
    run = subprocess.run(
        ["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=280, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # The scenarios that neither disrupt a cluster nor need a shape of their own, all passed
    # (under make, make's own lines may come after pytest's summary).
    assert re.search(r"^\d+ passed, \d+ deselected\b", run.stdout, re.M), run.stdout
    # They ran on the existing cluster: its master saw their frameworks come and go.
    names = [f["name"] for f in existing.state()["completed_frameworks"]]
    assert any(name.startswith("peloton-test-") for name in names), names


def test_the_deploy_notes_configuration_is_valid(tmp_path: Path) -> None:
    notes = (ROOT / "deploy" / "mesos" / "README.md").read_text()
    (config,) = re.findall(r"^```yaml\n(.*?)^```$", notes, flags=re.S | re.M)
    path = tmp_path / "peloton.yaml"
    path.write_text(config)
    loaded = load_config_file(path)  # unknown keys and bad shapes are refused
    assert (loaded["mesos_role"], loaded["mesos_user"]) == ("peloton", "peloton")
