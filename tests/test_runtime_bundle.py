"""The collective runtime bundle for task containers (setup.py build_bundle,
peloton.collective.bundle): its layout, its self-check on this machine and in a chroot that holds
nothing but the bundle, a gang of two "hosts" of two ranks that allreduces over shared memory
within a host and TCP between them, a C worker built against the bundle, the C ABI reading the
gang environment exactly as peloton.core.gangenv does, and the bundle's image.

The project's own build makes the bundle: the fixture runs ``setup.py build_bundle``
(incremental) and fails on any compiler warning.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from images_support import BUNDLE, build_bundle

import peloton
from peloton.collective import bundle as rb
from peloton.core.containers import RUNTIME_DIR
from peloton.core.gangenv import GangEnv, GangEnvError, topology
from peloton.images import open_layer, read_image

MOUNT = "/opt/peloton"
DEADLINE_S = 60.0
# Where NCCL is not installed the self-check says so with the loader's own reason.
NO_NCCL = "no (cannot load NCCL (tried libnccl.so.2: cannot open shared object file"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")


@pytest.fixture(scope="module")
def bundle() -> Path:
    return build_bundle()


def check(
    bundle: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The self-check run from the build directory (through the bundled loader)."""
    return subprocess.run(
        [*rb.host_command(bundle), *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=dict(env or {}),
        check=False,
    )


def found(stdout: str) -> dict[str, str]:
    """The self-check's ``key: value`` lines."""
    return dict(line.split(": ", 1) for line in stdout.splitlines() if re.match(r"^[a-z]+: ", line))


def gang_lines(stdout: str) -> dict[int, dict[str, str]]:
    """Each rank's ``gang k=v ...`` line, by rank."""
    lines = [line.split()[1:] for line in stdout.splitlines() if line.startswith("gang ")]
    return {int(f["rank"]): f for f in (dict(kv.split("=", 1) for kv in line) for line in lines)}


def run_ranks(
    commands: Sequence[tuple[Sequence[str], Mapping[str, str]]],
) -> list[subprocess.CompletedProcess[str]]:
    """Starts every (argv, env) at once and waits for all; fails naming the ranks still running
    at the deadline."""
    procs = [
        subprocess.Popen(
            list(argv),
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv, env in commands
    ]
    deadline = time.monotonic() + DEADLINE_S
    results = []
    try:
        for rank, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                late = [r for r, q in enumerate(procs) if q.poll() is None]
                pytest.fail(f"ranks {late} still running after {DEADLINE_S} s: {commands[rank]}")
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def kernel_ports(hosts: Sequence[str]) -> list[int]:
    """A free port on each host address, all held at once (so two on one address differ)."""
    socks = []
    try:
        for host in hosts:
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def gang_envs(hosts: Sequence[str], timeout: float = 20.0) -> list[dict[str, str]]:
    """The environment of each rank of a gang placed on ``hosts`` (by rank), as the scheduler
    writes it."""
    peers = [f"{h}:{p}" for h, p in zip(hosts, kernel_ports(hosts), strict=True)]
    return [
        GangEnv.at(rank, len(hosts), peers, where, timeout=timeout).to_env()
        for rank, where in enumerate(topology(hosts))
    ]


# ---------------------------------------------------------------- layout


def test_the_bundle_holds_the_runtime_its_abi_and_the_c_library_it_runs_on(bundle: Path) -> None:
    assert rb.version(bundle) == peloton.__version__
    assert rb.reference(bundle) == f"peloton-runtime:{peloton.__version__}"
    check_bin = bundle / "bin" / rb.CHECK
    assert os.access(check_bin, os.X_OK)
    assert (bundle / "include" / "peloton_collective.h").is_file()
    assert (bundle / "share" / "examples" / "allreduce_worker.c").is_file()
    loader = rb.interpreter(check_bin)
    assert loader.parent == PurePosixPath(MOUNT, "lib", "glibc")
    assert rb.mount_path(bundle) == PurePosixPath(MOUNT)
    glibc = {p.name for p in (bundle / "lib" / "glibc").iterdir()}
    assert {loader.name, "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0"} <= glibc
    # Tasks put lib/ on LD_LIBRARY_PATH: the runtime library only, never a C library that
    # would be loaded under an image's own loader.
    assert {p.name for p in (bundle / "lib").iterdir()} == {rb.LIBRARY, "glibc"}
    assert rb.task_env(bundle) == {"PATH": f"{MOUNT}/bin", "LD_LIBRARY_PATH": f"{MOUNT}/lib"}


def test_the_library_exports_the_c_abi_and_nothing_else(bundle: Path) -> None:
    header = (bundle / "include" / "peloton_collective.h").read_text()
    declared = set(re.findall(r"PELOTON_API [^(]*?\b(peloton_\w+)\(", header))
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(bundle / "lib" / rb.LIBRARY)],
        capture_output=True,
        text=True,
        check=True,
        timeout=DEADLINE_S,
    ).stdout
    exported = {line.split()[-1] for line in symbols.splitlines() if line.split()[1] in "TtWDB"}
    assert declared == exported
    assert "peloton_allreduce" in declared


def test_locate_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(
        rb.BundleError, match=r"missing VERSION, bin/peloton-collective-check.*make"
    ):
        rb.locate(tmp_path)


# ---------------------------------------------------------------- on this machine


@pytest.mark.parametrize("ranks", [2, 4])
def test_local_ranks_allreduce_over_shared_memory(bundle: Path, ranks: int) -> None:
    result = check(bundle, "--local", str(ranks))
    assert result.returncode == 0, result.stdout + result.stderr
    facts = found(result.stdout)
    assert facts["version"] == peloton.__version__
    assert facts["tcp"] == "yes"
    assert facts["shm"] == "yes"
    assert facts["nccl"] == "yes" or facts["nccl"].startswith(NO_NCCL), facts["nccl"]
    lines = gang_lines(result.stdout)
    assert sorted(lines) == list(range(ranks))
    for fields in lines.values():
        assert fields["size"] == str(ranks)
        assert fields["local_size"] == str(ranks)
        assert (fields["local"], fields["cross"], fields["result"]) == ("shm", "none", "ok")
    assert facts["local"] == f"ok, {ranks} ranks, local traffic over shm"


def test_two_hosts_of_two_ranks_use_shared_memory_within_and_tcp_between(bundle: Path) -> None:
    # Two loopback addresses stand for two hosts: each rank listens on its host's address.
    hosts = ["127.0.1.1", "127.0.1.1", "127.0.1.2", "127.0.1.2"]
    envs = gang_envs(hosts)
    results = run_ranks([([*rb.host_command(bundle), "--gang"], env) for env in envs])
    for rank, (result, env) in enumerate(zip(results, envs, strict=True)):
        assert result.returncode == 0, f"rank {rank}:\n{result.stdout}{result.stderr}"
        fields = gang_lines(result.stdout)[rank]
        assert fields == {
            "rank": str(rank),
            "size": "4",
            "local_rank": env["PELOTON_LOCAL_RANK"],
            "local_size": "2",
            "cross_rank": env["PELOTON_CROSS_RANK"],
            "cross_size": "2",
            "local": "shm",
            "cross": "tcp",
            "result": "ok",
        }


def test_a_rank_whose_peer_never_comes_fails_with_a_message(bundle: Path) -> None:
    env = gang_envs(["127.0.0.1", "127.0.0.1"], timeout=1)[0]
    result = check(bundle, "--gang", env=env)
    assert result.returncode == 1
    assert "error: cannot join the gang: rank 0: ranks [1] did not connect within 1 s" in (
        result.stderr
    )


def test_misuse_is_exit_status_2(bundle: Path) -> None:
    result = check(bundle, "--local", "0")
    assert result.returncode == 2
    assert "--local 0" in result.stderr


# ---------------------------------------------------------------- in an empty root


def rootfs(tmp_path: Path, bundle: Path, *, dev_shm: bool) -> Path:
    """A root that holds the bundle at /opt/peloton and nothing else (but an empty /dev/shm,
    what every container runtime mounts, when asked)."""
    root = tmp_path / "root"
    shutil.copytree(bundle, root / MOUNT.lstrip("/"))
    if dev_shm:
        (root / "dev" / "shm").mkdir(parents=True)
    return root


@needs_root
@pytest.mark.parametrize("dev_shm", [True, False], ids=["dev-shm", "bare"])
def test_the_self_check_passes_in_a_root_with_nothing_but_the_bundle(
    bundle: Path, tmp_path: Path, dev_shm: bool
) -> None:
    root = rootfs(tmp_path, bundle, dev_shm=dev_shm)
    assert sorted(p.name for p in root.iterdir()) == (["dev", "opt"] if dev_shm else ["opt"])
    result = subprocess.run(
        [CHROOT, str(root), f"{MOUNT}/bin/{rb.CHECK}", "--local", "2"],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env={},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    facts = found(result.stdout)
    assert facts["nccl"].startswith(NO_NCCL)
    transport = "shm" if dev_shm else "tcp"
    assert facts["local"] == f"ok, 2 ranks, local traffic over {transport}"
    if not dev_shm:
        assert facts["shm"].startswith("no (cannot open shared memory /peloton-probe-")
    lines = gang_lines(result.stdout)
    assert [lines[r]["local"] for r in (0, 1)] == (["shm"] * 2 if dev_shm else ["none"] * 2)
    assert [lines[r]["result"] for r in (0, 1)] == ["ok", "ok"]


def example_build_command(bundle: Path, out: Path) -> list[str]:
    """The example's own build command (its header comment), pointed at this bundle for -I/-L."""
    text = (bundle / "share" / "examples" / "allreduce_worker.c").read_text()
    match = re.search(r"^ \*\s+(cc .*?[^\\])$", text, flags=re.MULTILINE | re.DOTALL)
    assert match, "the example says how to build it"
    command = re.sub(r"\\\n \*", " ", match.group(1))
    command = command.replace(f"-I{MOUNT}/include", f"-I{bundle}/include")
    command = command.replace(f"-L{MOUNT}/lib", f"-L{bundle}/lib")
    argv = shlex.split(command)
    argv[argv.index("-o") + 1] = str(out)
    argv[argv.index("allreduce_worker.c")] = str(bundle / "share/examples/allreduce_worker.c")
    return [os.environ.get("CC", "cc"), *argv[1:], "-Wall", "-Wextra", "-Werror"]


@needs_root
def test_a_c_worker_built_against_the_bundle_allreduces_in_an_empty_root(
    bundle: Path, tmp_path: Path
) -> None:
    root = rootfs(tmp_path, bundle, dev_shm=True)
    (root / "work").mkdir()
    worker = root / "work" / "allreduce_worker"
    build = subprocess.run(
        example_build_command(bundle, worker), capture_output=True, text=True, timeout=DEADLINE_S
    )
    assert build.returncode == 0, build.stderr
    assert rb.interpreter(worker) == rb.interpreter(bundle / "bin" / rb.CHECK)
    envs = gang_envs(["127.0.0.1", "127.0.0.1"])
    results = run_ranks([([CHROOT, str(root), "/work/allreduce_worker"], env) for env in envs])
    for rank, result in enumerate(results):
        assert result.returncode == 0, f"rank {rank}:\n{result.stdout}{result.stderr}"
        assert result.stdout.strip() == f"worker rank={rank} size=2 local=shm mean=0.5"


# ---------------------------------------------------------------- the gang environment contract


def python_reads(env: Mapping[str, str]) -> tuple[str, object]:
    """What peloton.core.gangenv makes of ``env``: the fields the runtime uses, or the error."""
    try:
        g = GangEnv.from_env(env)
    except GangEnvError as exc:
        return ("error", str(exc))
    where = (g.rank, g.size, g.local_rank, g.local_size, g.cross_rank, g.cross_size)
    return ("ok", (*where, g.timeout, g.fusion_threshold))


def c_reads(bundle: Path, env: Mapping[str, str]) -> tuple[str, object]:
    """What the C ABI (peloton_gang_from_env, through the self-check's --env) makes of ``env``."""
    result = check(bundle, "--env", env=env)
    if result.returncode != 0:
        assert result.returncode == 1, result.stderr
        return ("error", result.stderr.strip().removeprefix("error: "))
    line = next(x for x in result.stdout.splitlines() if x.startswith("env "))
    f = dict(item.split("=", 1) for item in line.split()[1:])
    keys = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")
    where = [int(f[k]) for k in keys]
    return ("ok", (*where, float(f["timeout"]), int(f["fusion_threshold"])))


def scheduler_env(hosts: Sequence[str], rank: int, **rest: Any) -> dict[str, str]:
    peers = [f"{h}:{7000 + i}" for i, h in enumerate(hosts)]
    return GangEnv.at(rank, len(hosts), peers, topology(hosts)[rank], **rest).to_env()


BASE = {"PELOTON_GANG_SIZE": "2", "PELOTON_RANK": "1", "PELOTON_PEERS": "a:1,b:2"}
CONTRACT_CASES: list[dict[str, str]] = [
    # What the scheduler writes, for several placements and settings.
    scheduler_env(["a"], 0),
    scheduler_env(["a", "a", "b", "b"], 3, timeout=2.5),
    scheduler_env(["a", "b", "b", "c"], 2, fusion_threshold=1024, job_id="j", instance_id=2),
    scheduler_env(["a", "a", "a", "b"], 3, timeout=0.25, ports=(("http", 80),)),
    # Defaults and the forms Python's int() and float() accept.
    BASE,
    {**BASE, "PELOTON_RANK": " +1 ", "PELOTON_LOCAL_SIZE": "0_2", "PELOTON_LOCAL_RANK": "\t1\n"},
    {**BASE, "PELOTON_COLLECTIVE_TIMEOUT": "1_0.5e-1", "PELOTON_FUSION_THRESHOLD": "1e3"},
    {**BASE, "PELOTON_COLLECTIVE_TIMEOUT": " .5", "PELOTON_FUSION_THRESHOLD": "2.9"},
    {
        **BASE,
        "PELOTON_COLLECTIVE_TIMEOUT": "",
        "PELOTON_CROSS_RANK": "-3",
        "PELOTON_CROSS_SIZE": " ",
    },
    {**BASE, "PELOTON_PEERS": " [::1]:80 , h:00443"},
    # Each check, failing.
    {},
    {"PELOTON_GANG_SIZE": "2"},
    {**BASE, "PELOTON_GANG_SIZE": "two"},
    {**BASE, "PELOTON_GANG_SIZE": "0", "PELOTON_RANK": "0"},
    {**BASE, "PELOTON_RANK": "2"},
    {**BASE, "PELOTON_RANK": "-1"},
    {**BASE, "PELOTON_RANK": "1__0"},
    {**BASE, "PELOTON_RANK": "\x1c1"},
    {**BASE, "PELOTON_PEERS": ""},
    {**BASE, "PELOTON_PEERS": "a:1"},
    {**BASE, "PELOTON_PEERS": "a:1,b:2,"},
    {**BASE, "PELOTON_PEERS": "a:1,b"},
    {**BASE, "PELOTON_PEERS": "a:1,:2"},
    {**BASE, "PELOTON_PEERS": "a:0,b:2"},
    {**BASE, "PELOTON_PEERS": "a:1,b:65536"},
    {**BASE, "PELOTON_PEERS": "a:1,b:+2"},
    {**BASE, "PELOTON_PEERS": "a:1,it's:x"},
    {**BASE, "PELOTON_LOCAL_RANK": "2", "PELOTON_LOCAL_SIZE": "2"},
    {**BASE, "PELOTON_LOCAL_SIZE": "0"},
    {**BASE, "PELOTON_CROSS_SIZE": "2.0"},
    {**BASE, "PELOTON_COLLECTIVE_TIMEOUT": "0"},
    {**BASE, "PELOTON_COLLECTIVE_TIMEOUT": "-1"},
    {**BASE, "PELOTON_COLLECTIVE_TIMEOUT": "nan"},
    {**BASE, "PELOTON_COLLECTIVE_TIMEOUT": "0x10"},
    {**BASE, "PELOTON_COLLECTIVE_TIMEOUT": "1e"},
    {**BASE, "PELOTON_COLLECTIVE_TIMEOUT": 'say "\\no\'"'},
    {**BASE, "PELOTON_FUSION_THRESHOLD": "-0.0"},
]


@pytest.mark.parametrize("env", CONTRACT_CASES)
def test_the_c_abi_reads_the_gang_environment_as_gangenv_does(
    bundle: Path, env: dict[str, str]
) -> None:
    assert c_reads(bundle, env) == python_reads(env)


# Values of each variable, good and bad, that Python's int() and float() read the same as the C
# ABI (numbers beyond a C int and infinities are where the two part: see gang_env.h).
INTS = [
    "0",
    "1",
    "2",
    "3",
    " 2 ",
    "+1",
    "-1",
    "0_1",
    "1__0",
    "x",
    "",
    "  ",
    "2.0",
    "\x0b3",
    "\x1f1",
]
FLOATS = ["30", "0.5", "1e-3", "1_0.5", ".5", "1.", "0", "-1", "nan", "abc", "", " 2 ", "1e", "0x1"]
PEERS = ["a:1", "b:2", " c:3 ", "[::1]:4", "d:0", "e", ":5", "f:6a", "g:65535", "h:99999", ""]
VARIABLES = {
    "PELOTON_GANG_SIZE": st.sampled_from(INTS),
    "PELOTON_RANK": st.sampled_from(INTS),
    "PELOTON_PEERS": st.lists(st.sampled_from(PEERS), max_size=4).map(",".join),
    "PELOTON_LOCAL_RANK": st.sampled_from(INTS),
    "PELOTON_LOCAL_SIZE": st.sampled_from(INTS),
    "PELOTON_CROSS_RANK": st.sampled_from(INTS),
    "PELOTON_CROSS_SIZE": st.sampled_from(INTS),
    "PELOTON_COLLECTIVE_TIMEOUT": st.sampled_from(FLOATS),
    "PELOTON_FUSION_THRESHOLD": st.sampled_from(FLOATS),
}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(env=st.fixed_dictionaries({}, optional=VARIABLES))
def test_the_c_abi_and_gangenv_agree_on_generated_environments(
    bundle: Path, env: dict[str, str]
) -> None:
    assert c_reads(bundle, env) == python_reads(env)


# ---------------------------------------------------------------- the image


def test_the_image_holds_the_bundle_at_its_root(bundle: Path, tmp_path: Path) -> None:
    """Mounted as an image volume at /opt/peloton, the image's root is the bundle; run by itself,
    its opt/peloton link leads the programs to their loader."""
    out = rb.write_bundle_image(bundle, tmp_path / "peloton-runtime.tar")
    image = read_image(out)
    assert image.reference == f"peloton-runtime:{peloton.__version__}"
    assert image.config.entrypoint == (f"{MOUNT}/bin/{rb.CHECK}",)
    assert image.config.env == rb.task_env(bundle)
    [layer] = image.layers
    with open_layer(image, layer) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
    check_member = members[f"bin/{rb.CHECK}"]
    assert check_member.isfile() and check_member.mode & stat.S_IXUSR
    assert check_member.size == (bundle / "bin" / rb.CHECK).stat().st_size
    assert f"lib/{rb.LIBRARY}" in members
    assert "lib/glibc/libc.so.6" in members
    link = members["opt/peloton"]
    assert link.issym() and link.linkname == ".."
    root = tmp_path / "root"
    root.mkdir()
    with open_layer(image, layer) as tar:
        tar.extractall(root, filter="tar")
    assert (root / "opt/peloton/lib/glibc/ld-linux-x86-64.so.2").resolve() == (
        root / "lib/glibc/ld-linux-x86-64.so.2"
    ).resolve()


def test_the_image_goes_into_a_registry_directory_by_reference(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = tmp_path / "registry"
    assert rb.main(["--bundle", str(bundle), "--registry", str(registry)]) == 0
    path = registry / f"peloton-runtime:{peloton.__version__}.tar"
    assert capsys.readouterr().out.strip() == str(path)
    assert read_image(path, f"peloton-runtime:{peloton.__version__}").layers
    assert rb.image_path(bundle) == BUNDLE.with_name("peloton-runtime.tar")


def test_the_bundle_mounts_where_the_host_manager_mounts_it(bundle: Path) -> None:
    """The bundle's programs name their loader under the path task containers mount it at."""
    assert str(rb.mount_path(bundle)) == RUNTIME_DIR == MOUNT
