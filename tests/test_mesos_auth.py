"""Mesos framework authentication: the daemon's secret file, its HTTP Basic credential, and a
minicluster that authenticates frameworks as a Mesos 1.11 master with
``--authenticate_http_frameworks --http_framework_authenticators=basic --credentials=FILE`` does.

The daemon runs as a real process against a minicluster that requires authentication: with the
right secret it subscribes and a job runs; with a wrong or no secret, or as another principal than
its framework registered with, it is refused, says why and backs off; with a secret file others
may read it refuses to start. README's subsection is run as written. The same checks run on real
Mesos in tests/mesos/test_framework_auth.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import (
    PELOTON,
    ROOT,
    DaemonProcess,
    Peloton,
    error_line,
    free_port,
    migrated_sqlite_url,
    run_peloton,
    scrape_metrics,
    wait_for,
)
from hypothesis import given
from hypothesis import strategies as st
from mesos_auth_support import (
    CREDENTIALS,
    OTHER,
    PRINCIPAL,
    REFUSALS,
    SECRET,
    auth_args,
    basic,
    check_refused_with_backoff,
    principal_answers,
    readme_blocks,
    unauthenticated_answers,
    wait_subscribed,
    write_credentials,
    write_secret,
)
from minicluster_support import RawScheduler, framework_info, get

from peloton.config import ServerConfig, load_config_file
from peloton.errors import InvalidArgument
from peloton.hostmgr.calls import Credential, read_credential
from peloton.hostmgr.framework import REFUSED_BACKOFF_MAX, _refused_body, refused_backoff
from peloton.minicluster import AgentSpec, Minicluster
from peloton.minicluster.http import UNAUTHORIZED_BODY, authenticate, read_credentials
from peloton.v1 import job_pb2

AGENT = "cpus:4;mem:4096;disk:10000;gpus:2;ports:[31000-31009]"
# Where README's secret file is.
ETC_SECRET = "/etc/peloton/mesos-secret"
WWW_AUTHENTICATE = 'Basic realm="mesos-master-scheduler"'


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    """A minicluster of one agent that authenticates frameworks against CREDENTIALS."""
    mc = Minicluster(
        [AgentSpec("agent-0", resources=AGENT)],
        work_dir=tmp_path / "cluster",
        allocation_interval=0.1,
        update_retry_interval=1.0,
        free_ports=True,
        credentials=CREDENTIALS,
    )
    mc.start()
    yield mc
    mc.stop()


# ---------------------------------------------------------------------------- the secret file


def test_the_secret_is_read_without_its_line_break_and_never_shown(tmp_path: Path) -> None:
    path = write_secret(tmp_path / "secret")
    credential = read_credential(PRINCIPAL, str(path))
    assert credential == Credential(PRINCIPAL, SECRET)
    assert SECRET not in repr(credential) and SECRET not in str(credential)
    assert credential.headers() == basic(PRINCIPAL, SECRET)
    assert read_credential(PRINCIPAL, "") is None  # no file: no authentication


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o640])
def test_a_file_only_its_owner_and_group_read_is_taken(tmp_path: Path, mode: int) -> None:
    path = write_secret(tmp_path / "secret", mode=mode)
    assert read_credential(PRINCIPAL, str(path)) == Credential(PRINCIPAL, SECRET)


@pytest.mark.parametrize(
    ("principal", "content", "mode", "field", "reason"),
    [
        (PRINCIPAL, SECRET, 0o644, "mesos_secret_file", "permissions 0644 for {path} are too open"),
        (PRINCIPAL, SECRET, 0o602, "mesos_secret_file", "permissions 0602 for {path} are too open"),
        ("", SECRET, 0o600, "mesos_secret_file", "needs mesos_principal"),
        ("pel:oton", SECRET, 0o600, "mesos_principal", "contains ':'"),
        (PRINCIPAL, "a:" + SECRET, 0o600, "mesos_secret_file", "holds a secret with ':'"),
        (PRINCIPAL, "", 0o600, "mesos_secret_file", "{path} is empty"),
        (PRINCIPAL, SECRET + "\nmore", 0o600, "mesos_secret_file", "more than one line"),
    ],
)
def test_a_bad_secret_file_is_refused_naming_the_option(
    tmp_path: Path, principal: str, content: str, mode: int, field: str, reason: str
) -> None:
    path = write_secret(tmp_path / "secret", content, mode)
    with pytest.raises(InvalidArgument) as caught:
        read_credential(principal, str(path))
    assert caught.value.field == field
    assert reason.format(path=path) in caught.value.reason
    assert SECRET not in str(caught.value)


def test_a_missing_or_odd_secret_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"cannot read .*: No such file or directory"):
        read_credential(PRINCIPAL, str(tmp_path / "nothing"))
    with pytest.raises(InvalidArgument, match="is not a regular file"):
        read_credential(PRINCIPAL, str(tmp_path))
    latin1 = tmp_path / "latin1"
    latin1.write_bytes("s\xe9cret".encode("latin-1"))
    latin1.chmod(0o600)
    with pytest.raises(InvalidArgument, match="is not UTF-8 text"):
        read_credential(PRINCIPAL, str(latin1))


# Principals and secrets HTTP Basic can carry to Mesos: no ':' and no line break.
_part = st.text(st.characters(codec="utf-8", exclude_characters=":\r\n"), min_size=1)


@given(principal=_part, secret=_part, other=_part)
def test_the_daemon_credential_authenticates_exactly_its_principal(
    principal: str, secret: str, other: str
) -> None:
    """The daemon's Authorization header and the minicluster's authenticator agree: a
    credential authenticates as its principal with its secret, and with no other secret."""
    header = Credential(principal, secret).authorization
    assert authenticate(header, {principal: secret}) == principal
    assert authenticate(header, {principal: secret + other}) is None
    assert authenticate(header, {principal + other: secret}) is None


def test_refusals_back_off_doubling_up_to_a_minute() -> None:
    assert [refused_backoff(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]


@given(st.integers(min_value=1, max_value=10**6))
def test_the_backoff_never_shrinks_nor_passes_its_cap(refusals: int) -> None:
    assert refused_backoff(refusals) <= refused_backoff(refusals + 1) <= REFUSED_BACKOFF_MAX


def test_the_master_answer_is_read_from_pymesos_error() -> None:
    # pymesos raises RuntimeError('Failed with HTTP %s: %s' % (code, body_bytes)).
    assert _refused_body(RuntimeError("Failed with HTTP 401: b'401 Unauthorized.'")) == (
        "401 Unauthorized."
    )
    quoted = b"Authenticated principal 'other' does not match"
    assert _refused_body(RuntimeError(f"Failed with HTTP 400: {quoted!r}")) == quoted.decode()
    # A body not all received: pymesos fails adding ' ...' to bytes.
    assert _refused_body(TypeError("can't concat str to bytes")) == ""


# ---------------------------------------------------------------------------- the minicluster


def test_requests_without_a_valid_credential_get_mesos_401(cluster: Minicluster) -> None:
    answers = unauthenticated_answers(cluster.address)
    for case, answer in answers.items():
        assert answer == (
            401,
            "Unauthorized",
            WWW_AUTHENTICATE,
            "text/plain; charset=utf-8",
            UNAUTHORIZED_BODY,
        ), case
    # Other endpoints are not authenticated (as without --authenticate_http_readonly).
    assert get(cluster.address, "/master/state")[0] == 200


def test_a_framework_is_the_principal_it_authenticated_as(cluster: Minicluster) -> None:
    answers = principal_answers(cluster.address)
    assert answers["subscribe as another"] == (
        400,
        b"Failed to validate scheduler::Call: Authenticated principal 'other' does not match "
        b"principal 'peloton' set in `FrameworkInfo`",
    )
    assert answers["call as another"] == (
        400,
        b"Authenticated principal 'other' does not match principal 'peloton' set in "
        b"`FrameworkInfo`",
    )
    assert answers["subscribe again as another"] == (
        200,
        {"type": "ERROR", "error": {"message": "Changing framework's principal is not allowed."}},
    )
    assert answers["call"] == (202, b"")  # the framework itself was left as it was


def test_an_authenticated_framework_without_a_principal_gets_its_own(
    cluster: Minicluster,
) -> None:
    sched = RawScheduler(cluster.address, framework_info(), basic(PRINCIPAL, SECRET)).subscribe()
    try:
        _, _, body = get(cluster.address, "/master/state")
        (framework,) = json.loads(body)["frameworks"]
        assert framework["principal"] == PRINCIPAL
        assert sched.call("REVIVE") == (202, b"")
    finally:
        sched.close()


def test_without_credentials_the_minicluster_authenticates_nobody(tmp_path: Path) -> None:
    with Minicluster([AgentSpec("a", resources=AGENT)], work_dir=tmp_path) as mc:
        answers = unauthenticated_answers(mc.address)
        assert answers["no credentials"][0] == 200  # a subscription, taken unauthenticated
        assert answers["GET"][0] == 405


def test_the_credentials_file_is_mesos_json(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_credentials(tmp_path / "credentials.json")
    with caplog.at_level(logging.WARNING):
        assert read_credentials(path) == CREDENTIALS
        assert not caplog.records
        path.chmod(0o644)
        assert read_credentials(path) == CREDENTIALS
    assert caplog.messages == [
        f"Permissions on credentials file '{path}' are too open; it is recommended that your "
        "credentials file is NOT accessible by others"
    ]
    for text, why in [
        ("principal secret", "is not JSON"),
        ('{"credentials": []}', "must be"),
        ('{"credentials": [{"principal": "p"}]}', "credentials[0] needs a 'principal' and a"),
    ]:
        path.write_text(text)
        with pytest.raises(ValueError, match=re.escape(why)):
            read_credentials(path)


def test_minicluster_up_authenticates_frameworks(tmp_path: Path) -> None:
    credentials = write_credentials(tmp_path / "credentials.json")
    up = [sys.executable, "-m", "peloton.cli", "minicluster", "up", "--port", "0"]
    proc = subprocess.Popen(
        [*up, "--authenticate-http-frameworks", "--credentials", str(credentials)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.endswith(", frameworks authenticate)\n"), line
        address = line.split()[3]
        assert unauthenticated_answers(address)["no credentials"][0] == 401
        RawScheduler(address, headers=basic(PRINCIPAL, SECRET)).subscribe().close()
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    assert proc.returncode == 0

    alone = subprocess.run(
        [*up, "--authenticate-http-frameworks"], capture_output=True, text=True, timeout=60
    )
    assert alone.returncode == 2
    assert (
        alone.stderr.strip() == "error: invalid: --authenticate-http-frameworks needs --credentials"
    )


# ---------------------------------------------------------------------------- the daemon


def test_with_the_right_secret_the_daemon_subscribes_and_a_job_runs(
    db_url: str, cluster: Minicluster, tmp_path: Path
) -> None:
    secret_file = write_secret(tmp_path / "secret")
    extra = [*auth_args(secret_file), "--log-level", "debug"]
    p = Peloton(db_url, cluster, tmp_path / "daemon", extra)
    try:
        job_id = p.submit("echo trained", 1, gpu=1)
        assert p.wait_done(job_id).state == job_pb2.JOB_STATE_SUCCEEDED
        (framework,) = cluster.master.state_json()["frameworks"]
        assert framework["principal"] == PRINCIPAL
        assert not any(name == REFUSALS for name, _ in scrape_metrics(p.proc.metrics_port))
        assert SECRET not in p.proc.stderr
        # Every call (ACCEPT, ACKNOWLEDGE, ...) was authenticated too.
        assert "refused" not in p.proc.stderr and "call failed" not in p.proc.stderr
    finally:
        p.close()


@pytest.mark.parametrize(
    ("secret", "principal", "log"),
    [
        (
            "n0t-the-s3cret",
            PRINCIPAL,
            "Mesos master refused framework authentication for principal 'peloton': HTTP 401 "
            "'401 Unauthorized.': wrong principal or secret",
        ),
        (
            None,
            PRINCIPAL,
            "Mesos master refused framework authentication for principal 'peloton': HTTP 401 "
            "'401 Unauthorized.': the master authenticates frameworks and mesos_secret_file is "
            "not set",
        ),
        (
            None,
            "",
            "Mesos master refused framework authentication for principal '': HTTP 401 "
            "'401 Unauthorized.': the master authenticates frameworks: set mesos_principal and "
            "mesos_secret_file",
        ),
    ],
)
def test_a_refused_daemon_says_why_and_backs_off(
    cluster: Minicluster, tmp_path: Path, secret: str | None, principal: str, log: str
) -> None:
    secret_file = write_secret(tmp_path / "secret", secret) if secret else None
    db_url = migrated_sqlite_url(tmp_path)
    p = Peloton(db_url, cluster, tmp_path / "daemon", auth_args(secret_file, principal))
    try:
        check_refused_with_backoff(p, log)
        assert not cluster.frameworks()
        if secret:
            assert secret not in p.proc.stderr
            # The third refusal, as README quotes it.
            quoted = readme_blocks()[4][1].strip()
            wait_for(lambda: quoted in p.proc.stderr, 10, quoted, state=lambda: p.proc.stderr)
    finally:
        p.close()


def test_a_framework_is_refused_another_principal_and_backs_off(
    cluster: Minicluster, tmp_path: Path
) -> None:
    """Mesos keeps the principal a framework registered with: the daemon restarted as another
    principal (its framework id saved) is refused with an ERROR event, says why, backs off."""
    db_url = migrated_sqlite_url(tmp_path)
    first = Peloton(db_url, cluster, tmp_path / "first", auth_args(write_secret(tmp_path / "s")))
    try:
        wait_subscribed(first)
    finally:
        first.close()
    other = write_secret(tmp_path / "other", CREDENTIALS[OTHER])
    p = Peloton(db_url, cluster, tmp_path / "second", auth_args(other, OTHER))
    try:
        check_refused_with_backoff(
            p,
            "Mesos master refused the subscription of framework 'peloton': Changing framework's "
            "principal is not allowed. (a framework keeps the principal it registered with, none "
            "included: give peloton its former mesos_principal, or a new framework_name once its "
            "tasks have ended)",
            reason="error",
        )
        (framework,) = cluster.master.state_json()["frameworks"]
        assert framework["principal"] == PRINCIPAL and not framework["connected"]
    finally:
        p.close()


def test_a_secret_file_others_may_read_stops_the_daemon_at_start(
    cluster: Minicluster, tmp_path: Path
) -> None:
    secret_file = write_secret(tmp_path / "secret", mode=0o644)
    args = [
        "--db-url",
        migrated_sqlite_url(tmp_path),
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        "--mesos-master",
        cluster.address,
        *auth_args(secret_file),
    ]
    with DaemonProcess(tmp_path / "daemon", args) as proc:
        assert proc.wait_exit(30) == 2
        result = subprocess.CompletedProcess(args, 2, "", proc.stderr)
        assert error_line(result) == (
            f"error: invalid: mesos_secret_file: permissions 0644 for {secret_file} are too "
            f"open: others may access it; run chmod 600 {secret_file} (or 640, group-readable "
            "by a group of the daemon's user)"
        )
    assert not cluster.frameworks()


def test_the_help_names_the_option_and_no_secret(tmp_path: Path) -> None:
    secret_file = write_secret(tmp_path / "secret")
    env = {"PELOTON_MESOS_SECRET_FILE": str(secret_file), "PELOTON_MESOS_PRINCIPAL": PRINCIPAL}
    result = run_peloton("server", "--help", env=env)
    assert result.returncode == 0
    assert "--mesos-secret-file" in result.stdout
    assert SECRET not in result.stdout and str(secret_file) not in result.stdout


# ---------------------------------------------------------------------------- README


def test_every_readme_block_is_checked_here() -> None:
    # master flags (tests/mesos), credentials, secret file, config, a refusal's log line, the
    # minicluster example
    assert [lang for lang, _ in readme_blocks()] == ["sh", "json", "sh", "yaml", "", "sh"]


def test_the_readme_files_are_what_the_master_and_the_daemon_read(tmp_path: Path) -> None:
    blocks = [text for _, text in readme_blocks()]
    credentials = tmp_path / "credentials.json"
    credentials.write_text(blocks[1])
    credentials.chmod(0o600)
    secrets = read_credentials(credentials)
    assert list(secrets) == [PRINCIPAL]
    # The secret file's commands, as the daemon's own user in a scratch directory.
    secret_file = tmp_path / "mesos-secret"
    script = blocks[2].replace("sudo ", "").replace("-o peloton ", "")
    script = script.replace(ETC_SECRET, str(secret_file))
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], check=True, timeout=30)
    assert read_credential(PRINCIPAL, str(secret_file)) == Credential(PRINCIPAL, secrets[PRINCIPAL])
    config = ServerConfig(**load_config_file(_written(tmp_path / "peloton.yaml", blocks[3])))
    assert (config.mesos_principal, config.mesos_secret_file) == (PRINCIPAL, ETC_SECRET)
    # The refusal of a file others may read, as the README quotes it.
    secret_file.chmod(0o644)
    with pytest.raises(InvalidArgument) as caught:
        read_credential(PRINCIPAL, str(secret_file))
    quoted = f"error: invalid: {caught.value}".replace(str(secret_file), ETC_SECRET)
    prose = " ".join((ROOT / "README.md").read_text().split())
    assert quoted in prose.replace("`", "")


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_readme_minicluster_example_runs(tmp_path: Path) -> None:
    """The README's example as written, in a scratch directory, on a free port and with the
    daemon's own ports from the kernel: the daemon subscribes as its principal."""
    script = readme_blocks()[-1][1]
    assert script.startswith('cd "$(mktemp -d)"\n')
    port = str(free_port())
    script = script.removeprefix('cd "$(mktemp -d)"\n').replace("5050", port)
    script = script.replace(
        "--mesos-secret-file mesos-secret",
        "--mesos-secret-file mesos-secret --grpc-port 0 --metrics-port 0 --console-port 0 "
        "--log-format text",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PELOTON_")}
    env["PATH"] = f"{Path(PELOTON).parent}:{env['PATH']}"
    log = tmp_path / "example.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-e", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the script's own process group: stopped as one
        )
    try:

        def subscribed() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the example exited {proc.returncode}: {log.read_text()}")
            try:
                _, _, body = get(f"127.0.0.1:{port}", "/master/state")
            except OSError:
                return False
            return any(f.get("principal") == PRINCIPAL for f in json.loads(body)["frameworks"])

        wait_for(subscribed, 60, "the example's daemon to subscribe", 0.1, log.read_text)
        # The daemon says so a moment after the master shows it.
        wait_for(
            lambda: "subscribed to Mesos" in log.read_text(), 30, "its word", 0.1, log.read_text
        )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
