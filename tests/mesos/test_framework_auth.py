"""Framework authentication on real Mesos 1.11: a master started with
``--authenticate_http_frameworks --http_framework_authenticators=basic --credentials=FILE``.

With the right secret the daemon subscribes (as its principal) and a job runs; with a wrong or no
secret, or as another principal than its framework registered with, it is refused, says why, keeps
serving and backs off. The master's flags are README's. The minicluster, which
tests/test_mesos_auth.py holds to the same, must answer what this master answers: every request
without a valid credential, and a framework that is not the principal it authenticated as.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mesos_auth_support import (
    CREDENTIALS,
    OTHER,
    PRINCIPAL,
    SECRET,
    auth_args,
    check_refused_with_backoff,
    principal_answers,
    readme_blocks,
    unauthenticated_answers,
    wait_subscribed,
    write_credentials,
    write_secret,
)
from mesos_support import MesosPeloton, PelotonFactory, RealClusterFactory, agent_resources
from realcluster import RealCluster

from peloton.minicluster import AgentSpec, Minicluster
from peloton.v1 import job_pb2

# The master's flags are the test's own: never an operator's cluster.
pytestmark = pytest.mark.local_shape

AGENT = agent_resources(0, "cpus:8;mem:16384;disk:20000;gpus:4")


def readme_master_flags() -> dict[str, str]:
    """The framework authentication flags of README's ``mesos-master`` command, by name."""
    (command,) = [text for _, text in readme_blocks() if text.startswith("mesos-master ")]
    flags = dict(re.findall(r"--(\w+)(?:=(\S+))?", command))
    return {k: v or "true" for k, v in flags.items() if "authent" in k or k == "credentials"}


@pytest.fixture
def auth_cluster(real_cluster: RealClusterFactory, tmp_path: Path) -> RealCluster:
    """A local real cluster of one agent whose master authenticates frameworks, with the flags
    README gives (the credentials file, of CREDENTIALS, is the test's)."""
    flags = readme_master_flags()
    assert flags == {
        "authenticate_http_frameworks": "true",
        "http_framework_authenticators": "basic",
        "credentials": "/etc/mesos/credentials.json",
    }
    flags["credentials"] = str(write_credentials(tmp_path / "credentials.json"))
    env = {f"MESOS_{name.upper()}": value for name, value in flags.items()}
    return real_cluster(agents=1, resources=AGENT, env=env)


def test_with_the_right_secret_the_daemon_subscribes_and_a_job_runs(
    auth_cluster: RealCluster, make_peloton: PelotonFactory, tmp_path: Path
) -> None:
    secret_file = write_secret(tmp_path / "secret")
    p = make_peloton(auth_cluster, *auth_args(secret_file), "--log-level", "debug")
    assert p.framework()["principal"] == PRINCIPAL
    job_id = p.submit("echo trained", 1, gpu=1)
    assert p.wait_done(job_id).state == job_pb2.JOB_STATE_SUCCEEDED
    assert SECRET not in p.proc.stderr
    # Every call (ACCEPT, ACKNOWLEDGE, ...) was authenticated too.
    assert "refused" not in p.proc.stderr and "call failed" not in p.proc.stderr


@pytest.mark.parametrize(
    ("secret", "log"),
    [
        (
            "n0t-the-s3cret",
            "Mesos master refused framework authentication for principal 'peloton': HTTP 401 "
            "'401 Unauthorized.': wrong principal or secret",
        ),
        (
            None,
            "Mesos master refused framework authentication for principal 'peloton': HTTP 401 "
            "'401 Unauthorized.': the master authenticates frameworks and mesos_secret_file is "
            "not set",
        ),
    ],
)
def test_a_refused_daemon_says_why_and_backs_off(
    auth_cluster: RealCluster,
    make_peloton: PelotonFactory,
    tmp_path: Path,
    secret: str | None,
    log: str,
) -> None:
    secret_file = write_secret(tmp_path / "secret", secret) if secret else None
    p = make_peloton(auth_cluster, *auth_args(secret_file))
    check_refused_with_backoff(p, log)
    assert p.framework_name not in {f["name"] for f in auth_cluster.frameworks()}
    if secret:
        assert secret not in p.proc.stderr


def test_a_framework_is_refused_another_principal_and_backs_off(
    db_url: str, auth_cluster: RealCluster, make_peloton: PelotonFactory, tmp_path: Path
) -> None:
    first = make_peloton(auth_cluster, *auth_args(write_secret(tmp_path / "secret")))
    first.framework()
    wait_subscribed(first)
    assert first.proc.terminate() == 0  # its framework id is saved; the master keeps it
    other = write_secret(tmp_path / "other", CREDENTIALS[OTHER])
    p = MesosPeloton(
        db_url,
        auth_cluster,
        tmp_path / "second",
        auth_args(other, OTHER),
        framework_name=first.framework_name,
    )
    try:
        check_refused_with_backoff(
            p,
            "Mesos master refused the subscription of framework "
            f"'{first.framework_name}': Changing framework's principal is not allowed.",
            reason="error",
        )
        (framework,) = [f for f in auth_cluster.frameworks() if f["name"] == first.framework_name]
        assert framework["principal"] == PRINCIPAL and not framework["connected"]
    finally:
        p.close()


def test_the_minicluster_answers_as_the_real_master(
    auth_cluster: RealCluster, tmp_path: Path
) -> None:
    mc = Minicluster(
        [AgentSpec("agent-0", resources=AGENT)], work_dir=tmp_path / "mc", credentials=CREDENTIALS
    )
    with mc:
        real = unauthenticated_answers(auth_cluster.master)
        assert unauthenticated_answers(mc.address) == real
        assert {answer[0] for answer in real.values()} == {401}
        real_principal = principal_answers(auth_cluster.master)
        assert principal_answers(mc.address) == real_principal
