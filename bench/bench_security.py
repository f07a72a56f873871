"""What TLS and bearer-token authentication cost CreateJob: plaintext vs TLS + token, in one run.

Run from the repository root::

    .venv/bin/python -m bench.bench_security [--quick] [--backend B] [--callers N] [--calls N]

It starts two ``peloton server`` processes side by side, each on a fresh database of
``--backend`` (PostgreSQL by default: where a daemon that clients reach over a network keeps its
state): one plaintext without authentication, one with TLS (a self-signed certificate made here)
and a tokens file (the token's user a cluster admin, so that permissions allow everything). Both
record every CreateJob in the audit trail, as every daemon does. Rounds alternate between the
two (plaintext, then TLS + token, ``--repeats`` times), so that a machine whose speed drifts
treats both alike. A round is ``--calls`` CreateJob calls of 1-task jobs from ``--callers``
concurrent callers (``--procs`` processes, each with one :class:`~peloton.client.PelotonClient`
shared by its threads, warmed up first), then 300 calls from one caller (the latency of one call
on an idle daemon). It prints the medians of both modes and their ratio (TLS + token /
plaintext) with the CPU calibration before and after, and writes them to
``.bench/bench_security.json``. ``--quick`` is a smoke test (fewer calls, one round). Daemons and
callers are always stopped, even when a step fails.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import multiprocessing as mp
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from queue import Empty
from typing import Any

from bench._client_worker import job_spec
from peloton.client import PelotonClient, Tls

REPO = Path(__file__).resolve().parents[1]
PELOTON = Path(sys.executable).with_name("peloton")
RESULTS = REPO / ".bench" / "bench_security.json"
START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 30.0
CALL_TIMEOUT_S = 60.0
USER = "bench"
POOLS = ("/bench", "/bench/create")


@dataclass(frozen=True)
class Settings:
    repeats: int
    calls: int  # measured CreateJob calls per repeat, over all callers
    procs: int
    threads: int  # callers per process
    warmup: int  # warm-up calls per caller


@dataclass(frozen=True)
class Mode:
    """How the daemon serves and the client connects."""

    name: str
    ca: bytes | None = None
    token: str | None = None


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------- credentials


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (the certificate is its own CA)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "peloton bench")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "server.crt", directory / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def tokens_file(directory: Path, token: str) -> Path:
    from peloton.security.tokens import token_digest

    path = directory / "tokens.yaml"
    path.write_text(f"tokens:\n  - user: {USER}\n    sha256: {token_digest(token)}\n")
    return path


# ---------------------------------------------------------------------------- the daemon


class Daemon:
    """``peloton server`` on the database at ``url`` in its own process; ready once its port
    file exists (written when both ports serve), which needs no channel of the mode's kind."""

    def __init__(self, url: str, workdir: Path, args: Sequence[str]) -> None:
        from bench.bench_jobs import dies_with_us, migrate_db

        workdir.mkdir(parents=True, exist_ok=True)
        migrate_db(url, workdir)
        self.log_path = workdir / "server.log"
        port_file = workdir / "ports"
        cmd = [str(PELOTON), "server", "--db-url", url, "--data-dir", str(workdir / "data")]
        cmd += ["--grpc-port", "0", "--metrics-port", "0", "--console-port", "0"]
        cmd += ["--port-file", str(port_file)]
        cmd += ["--log-level", "warning", *args]
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                dies_with_us(cmd),
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_DEADLINE_S
        while not (port_file.exists() and port_file.read_text().split()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"peloton server did not start:\n{self.tail()}")
            time.sleep(0.05)
        self.target = f"127.0.0.1:{port_file.read_text().split()[0]}"

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------------------- callers


def caller_process(
    target: str,
    mode: Mode,
    worker: int,
    threads: int,
    warmup: int,
    count: int,
    tag: str,
    go: Event,
    queue: Queue[Any],
) -> None:
    """Warm up, report ``("ready", worker, None)``, wait for ``go``, then make ``threads x
    count`` CreateJob calls and report ``("ok", worker, [(start, end, latencies)])``; a failure
    is reported as ``("error", worker, traceback)``."""
    tls = Tls(ca=mode.ca) if mode.ca else None
    try:
        with PelotonClient(target, timeout=CALL_TIMEOUT_S, tls=tls, token=mode.token) as client:
            _threads(client, f"warm-{tag}-{worker}", threads, warmup)
            queue.put(("ready", worker, None))
            if not go.wait(timeout=600):
                raise RuntimeError("no go from the coordinator within 600 s")
            queue.put(("ok", worker, _threads(client, f"{tag}-{worker}", threads, count)))
    except BaseException:
        queue.put(("error", worker, traceback.format_exc()))


def _threads(
    client: PelotonClient, prefix: str, threads: int, count: int
) -> list[tuple[float, float, list[float]]]:
    runs: list[tuple[float, float, list[float]]] = []
    errors: list[BaseException] = []

    def run(t: int) -> None:
        latencies: list[float] = []
        start = time.perf_counter()
        try:
            for i in range(count):
                spec = job_spec(f"{prefix}-t{t}-{i}", team=i)
                t0 = time.perf_counter()
                client.create_job(spec)
                latencies.append(time.perf_counter() - t0)
        except BaseException as exc:
            errors.append(exc)
        runs.append((start, time.perf_counter(), latencies))

    pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise errors[0]
    return runs


def _collect(queue: Any, procs: Sequence[Any], expect: str) -> list[Any]:
    reports: list[Any] = []
    deadline = time.monotonic() + 600
    while len(reports) < len(procs):
        try:
            status, worker, payload = queue.get(timeout=1)
        except Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"callers not {expect}: {dead or 'timed out'}") from None
            continue
        if status != expect:
            raise RuntimeError(f"caller {worker} failed:\n{payload}")
        reports.append(payload)
    return reports


def measure(target: str, mode: Mode, cfg: Settings, tag: str) -> dict[str, float]:
    """One measured round: p50/p99 (ms) and calls/s of every caller together."""
    from bench.bench_jobs import percentile

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    go = ctx.Event()
    per_thread = max(1, cfg.calls // (cfg.procs * cfg.threads))
    procs = [
        ctx.Process(
            target=caller_process,
            args=(target, mode, w, cfg.threads, cfg.warmup, per_thread, tag, go, queue),
            daemon=True,
        )
        for w in range(cfg.procs)
    ]
    for p in procs:
        p.start()
    try:
        _collect(queue, procs, "ready")
        go.set()
        runs = [run for report in _collect(queue, procs, "ok") for run in report]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    latencies = [x for _, _, lat in runs for x in lat]
    wall = max(end for _, end, _ in runs) - min(start for start, _, _ in runs)
    return {
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "calls_per_s": len(latencies) / wall,
    }


# One caller's calls per round: the latency of one call on an otherwise idle daemon.
SINGLE_CALLS = 300
METRICS = (("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("calls_per_s", "calls/s"))


def start_mode(
    mode: Mode, args: Sequence[str], url: str, workdir: Path, stack: contextlib.ExitStack
) -> str:
    """Start ``mode``'s daemon (stopped when ``stack`` closes) and make its pools; its target."""
    daemon = Daemon(url, workdir / mode.name, args)
    stack.callback(daemon.stop)
    log(f"{mode.name}: daemon pid {daemon.proc.pid} serving on {daemon.target}")
    tls = Tls(ca=mode.ca) if mode.ca else None
    with PelotonClient(daemon.target, timeout=30, tls=tls, token=mode.token) as client:
        from peloton.v1 import pool_pb2

        for path in POOLS:
            client.create_pool(pool_pb2.PoolSpec(path=path))
    return daemon.target


def medians(rounds: Sequence[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def main(argv: Sequence[str] | None = None) -> int:
    from bench.bench_jobs import cpu_calibration_ms, database, machine

    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_security", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: few calls, one round")
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="postgresql")
    parser.add_argument("--procs", type=int, default=4, help="caller processes (default 4)")
    parser.add_argument("--callers", type=int, default=8, help="concurrent callers (default 8)")
    parser.add_argument("--calls", type=int, default=None, help="CreateJob calls per round")
    parser.add_argument("--repeats", type=int, default=None, help="rounds per mode (default 3)")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results ({RESULTS})")
    args = parser.parse_args(argv)
    if args.callers % args.procs:
        parser.error("--callers must be a multiple of --procs")
    cfg = Settings(
        repeats=args.repeats or (1 if args.quick else 3),
        calls=args.calls or (200 if args.quick else 4_000),
        procs=args.procs,
        threads=args.callers // args.procs,
        warmup=5 if args.quick else 25,
    )
    single = Settings(1, 50 if args.quick else SINGLE_CALLS, 1, 1, cfg.warmup)
    report: dict[str, Any] = {"machine": machine(), "calibration_ms_before": cpu_calibration_ms()}
    rounds: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="peloton-bench-security-") as tmp:
        workdir = Path(tmp)
        cert_file, key_file = self_signed(workdir)
        token = secrets.token_hex(32)
        secure = [
            *("--tls-cert-file", str(cert_file), "--tls-key-file", str(key_file)),
            *("--auth-tokens-file", str(tokens_file(workdir, token))),
            *("--admins", f"user:{USER}"),
        ]
        modes: tuple[tuple[Mode, list[str]], ...] = (
            (Mode("plaintext"), []),
            (Mode("tls_token", cert_file.read_bytes(), token), secure),
        )
        for mode, _ in modes:
            (workdir / mode.name).mkdir()
        with contextlib.ExitStack() as stack:
            targets = {
                mode.name: start_mode(
                    mode,
                    mode_args,
                    stack.enter_context(database(args.backend, workdir / mode.name)),
                    workdir,
                    stack,
                )
                for mode, mode_args in modes
            }
            for r in range(cfg.repeats):
                for mode, _ in modes:
                    target = targets[mode.name]
                    many = measure(target, mode, cfg, f"{mode.name}-r{r}")
                    one = measure(target, mode, single, f"{mode.name}-one-r{r}")
                    result = {**many, "one_caller_p50_ms": one["p50_ms"]}
                    log(
                        f"{mode.name} round {r + 1}: "
                        + ", ".join(f"{k} {v:.2f}" for k, v in result.items())
                    )
                    rounds.setdefault(mode.name, []).append(result)
    report["calibration_ms_after"] = cpu_calibration_ms()
    results = {name: medians(r) for name, r in rounds.items()}
    a, b = results["plaintext"], results["tls_token"]
    print(
        f"\nCreateJob, 1 task, {args.callers} callers, {args.backend} "
        f"({cfg.calls} calls a round, median of {cfg.repeats} rounds each, in turns)"
    )
    print(f"{'':20}{'plaintext':>12}{'TLS + token':>14}{'ratio':>8}")
    for key, label in (*METRICS, ("one_caller_p50_ms", "1 caller p50 ms")):
        print(f"{label:20}{a[key]:12.2f}{b[key]:14.2f}{b[key] / a[key]:8.2f}")
    print(
        f"CPU calibration {report['calibration_ms_before']:.0f} ms before, "
        f"{report['calibration_ms_after']:.0f} ms after"
    )
    report.update(
        time=datetime.now(UTC).isoformat(timespec="seconds"),
        backend=args.backend,
        settings=cfg.__dict__,
        callers=args.callers,
        rounds=rounds,
        results=results,
        ratio={key: b[key] / a[key] for key in a},
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nresults written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
