"""A trial's report to a daemon that serves TLS: over TLS, verified with the trial's CA
(README "Sweeps")."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from daemon import in_process_server, migrated_sqlite_url, wait_for
from test_sweep_service import sweep_spec
from tls_support import TestCa

from peloton.client import PelotonClient, Tls
from peloton.sweep.report import report
from peloton.sweep.trialjob import SWEEP_SERVER_TLS


class _Retried(Exception):
    """report() would wait and send again: the daemon was unavailable to it."""


def _retried(_seconds: float) -> None:
    raise _Retried


def test_a_report_to_a_tls_daemon_goes_over_tls_verified_with_the_trials_ca(
    tmp_path: Path,
) -> None:
    ca = TestCa(tmp_path / "pki")
    pem = ca.server()
    options = {"tls_cert_file": str(pem.cert_file), "tls_key_file": str(pem.key_file)}
    with in_process_server(migrated_sqlite_url(tmp_path), tmp_path / "data", **options) as server:
        env = {
            "SWEEP_SERVER": f"localhost:{server.grpc_port}",
            "SWEEP_TOKEN": "not-a-trial's",
            "PELOTON_JOB_ID": "no-such-job",
            "SWEEP_CA_FILE": str(ca.file),
        }
        # Its trials are told to report over TLS.
        with PelotonClient(
            f"localhost:{server.grpc_port}", timeout=10, tls=Tls.from_files(ca_file=ca.file)
        ) as client:
            spec = sweep_spec()
            spec.trial.pool = ""
            sweep = client.submit_sweep(spec)
            trial = wait_for(
                lambda: next((t for t in client.list_trials(sweep.sweep_id) if t.job_id), None),
                15,
                "a trial with a job",
                state=lambda: client.list_trials(sweep.sweep_id),
            )
            assert client.get_job(trial.job_id).spec.task.env[SWEEP_SERVER_TLS] == "1"
        # Over TLS the daemon answers (and refuses the token: no such trial).
        with pytest.raises(grpc.RpcError) as refused:
            report(1, {"loss": 0.5}, env={**env, SWEEP_SERVER_TLS: "1"}, sleep=_retried)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "SWEEP_TOKEN" in str(refused.value.details())
        # In plaintext, or trusting another CA, it cannot be reached.
        with pytest.raises(_Retried):
            report(1, {"loss": 0.5}, env=env, sleep=_retried)
        other = TestCa(tmp_path / "other", "another CA")
        with pytest.raises(_Retried):
            report(
                1,
                {"loss": 0.5},
                env={**env, SWEEP_SERVER_TLS: "1", "SWEEP_CA_FILE": str(other.file)},
                sleep=_retried,
            )
