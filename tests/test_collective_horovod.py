"""Horovod's names on peloton: a Horovod-style script under peloton-run, fp16 compression measured
on the wire, gradient predivision, the op constants, the build queries and SyncBatchNorm."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from collective_support import assert_all_ok, run_ranks

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "horovod_style_train.py"
RUN_TIMEOUT_S = 120
# tcp_info.tcpi_bytes_received (linux/tcp.h): bytes this socket has received, counted by the kernel.
TCPI_BYTES_RECEIVED = 128


def single_threaded() -> None:
    """One thread per rank: the ranks share this machine's cores (they run in fresh processes,
    spawned: a forked child of a test process that used torch can hang on the thread pools it
    inherits half-made, as CI saw)."""
    torch.set_num_threads(1)


# ---- the Horovod-style script under peloton-run ---------------------------------------------


def train(tmp: Path, n: int, *flags: str) -> list[dict[str, Any]]:
    """Runs the script as ``n`` ranks; every rank's final weights."""
    out = tmp / f"{n}{''.join(flags)}"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "peloton.collective.run", "-np", str(n), "--timeout", "30",
         sys.executable, str(SCRIPT), "--out", str(out), "--batches-per-allreduce", "2", *flags],
        cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line.split(":")[0] for line in proc.stdout.splitlines()] == [
        f"[0] step {s}" for s in range(5)
    ]
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(n)]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The script alone on the whole batches: what the ranks must end with."""
    (state,) = train(tmp_path_factory.mktemp("reference"), 1)
    return state


def assert_states(got: dict[str, Any], want: dict[str, Any], atol: float) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=atol, msg=name)


def test_script_matches_one_process_with_predivision(
    one_process: dict[str, Any], tmp_path: Path
) -> None:
    ranks = train(tmp_path, 2, "--gradient-predivide-factor", "2")
    assert_states(ranks[1], ranks[0], atol=0)
    assert_states(ranks[0], one_process, atol=1e-5)
    # SyncBatchNorm kept the whole batch's running statistics.
    assert int(ranks[0]["bn.num_batches_tracked"]) == 10


def test_script_with_fp16_allreduce_stays_close(
    one_process: dict[str, Any], tmp_path: Path
) -> None:
    ranks = train(tmp_path, 2, "--fp16-allreduce")
    assert_states(ranks[1], ranks[0], atol=0)
    assert_states(ranks[0], one_process, atol=5e-3)
    differs = any(not torch.equal(ranks[0][k], one_process[k]) for k in one_process)
    assert differs, "gradients went through float16"


def test_adasum_in_the_script_fails_naming_the_alternative(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "peloton.collective.run", "-np", "1", sys.executable, str(SCRIPT),
         "--out", str(tmp_path), "--use-adasum"],
        cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "Adasum is not implemented by peloton's runtime; use op=Average" in proc.stderr


# ---- compression ----------------------------------------------------------------------------


def test_fp16_compressor_sends_float16_and_restores_the_dtype() -> None:
    import peloton.horovod.torch as hvd

    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        t = torch.linspace(-2, 2, 9, dtype=dtype)
        wire, ctx = hvd.Compression.fp16.compress(t)
        assert wire.dtype == torch.float16
        assert wire.element_size() * 2 <= t.element_size() * 2 and wire.numel() == t.numel()
        back = hvd.Compression.fp16.decompress(wire, ctx)
        assert back.dtype == dtype
        torch.testing.assert_close(back, t, rtol=1e-3, atol=1e-3)
    ints = torch.arange(5)
    wire, ctx = hvd.Compression.fp16.compress(ints)
    assert wire is ints and hvd.Compression.fp16.decompress(wire, ctx) is ints
    wire, ctx = hvd.Compression.none.compress(ints)
    assert wire is ints and hvd.Compression.none.decompress(wire, ctx) is ints


def tcp_bytes_received() -> int:
    """What the kernel counted into every TCP socket this process holds."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:  # closed meanwhile (the listing's own fd, for one)
            continue
        with s:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
                total += struct.unpack_from("Q", info, TCPI_BYTES_RECEIVED)[0]
    return total


ELEMENTS = 1 << 20


def wire_bytes() -> dict[str, Any]:
    import peloton.horovod.torch as hvd

    single_threaded()

    x = torch.full((ELEMENTS,), float(hvd.rank() + 1))
    out: dict[str, Any] = {}
    for label, compression in (("none", hvd.Compression.none), ("fp16", hvd.Compression.fp16)):
        before = tcp_bytes_received()
        y = hvd.allreduce(x, op=hvd.Sum, name=label, compression=compression)
        out[label] = tcp_bytes_received() - before
        out[f"{label}.dtype"] = str(y.dtype)
        out[f"{label}.values"] = sorted(set(y.tolist()))
    return out


def test_fp16_compression_halves_the_bytes_on_the_wire() -> None:
    # One rank per host: the ranks talk TCP, whose received bytes the kernel counts. In a ring
    # of 2 each rank receives the whole tensor once (half in reduce-scatter, half in allgather).
    for res in assert_all_ok(run_ranks(wire_bytes, 2, start_method="spawn")):
        assert res["none.dtype"] == res["fp16.dtype"] == "torch.float32"
        assert res["none.values"] == res["fp16.values"] == [3.0]
        assert ELEMENTS * 4 <= res["none"] < ELEMENTS * 4 * 1.02
        assert ELEMENTS * 2 <= res["fp16"] < ELEMENTS * 2 * 1.02


# ---- scaling, grouping, predivision ---------------------------------------------------------


def scaled_and_grouped() -> dict[str, Any]:
    import peloton.horovod.torch as hvd

    single_threaded()

    r = hvd.rank()
    out: dict[str, Any] = {}
    # Sum of (r+1)*2 over ranks 0,1 = 6; then * 0.5.
    t = torch.tensor([float(r + 1)])
    out["scaled"] = hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5).tolist()
    out["untouched"] = t.item()
    inplace = [torch.tensor([float(r)]), torch.tensor([float(10 * r)], dtype=torch.float64)]
    same = hvd.grouped_allreduce_(inplace, op=hvd.Sum, name="g")
    out["inplace"] = [s is i for s, i in zip(same, inplace, strict=True)]
    out["grouped"] = [x.item() for x in inplace] + [str(x.dtype) for x in inplace]
    handle = hvd.grouped_allreduce_async([torch.tensor([1.0]), torch.tensor([r])], op=hvd.Max)
    out["async"] = [x.item() for x in hvd.synchronize(handle)]
    # Predivision: the same step as a plain Average, within rounding.
    steps = {}
    for f in (1.0, 8.0):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=1.0),
            named_parameters=model.named_parameters(),
            gradient_predivide_factor=f,
        )
        torch.manual_seed(1 + r)
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
        opt.remove_hooks()
        steps[f] = model.weight.detach().numpy()
    out["predivide"] = (steps[1.0], steps[8.0])
    return out


def test_prescale_postscale_grouped_and_predivide() -> None:
    for res in assert_all_ok(run_ranks(scaled_and_grouped, 2, start_method="spawn")):
        assert res["scaled"] == [3.0]
        assert res["untouched"] in (1.0, 2.0)  # the caller's tensor is not scaled in place
        assert res["inplace"] == [True, True]
        assert res["grouped"] == [1.0, 10.0, "torch.float32", "torch.float64"]
        assert res["async"] == [1.0, 1.0]
        plain, predivided = res["predivide"]
        np.testing.assert_allclose(predivided, plain, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"op": "sum", "gradient_predivide_factor": 2.0}, "only with op=Average"),
        ({"gradient_predivide_factor": 0.0}, "must be positive"),
        ({"op": "adasum"}, "Adasum is not implemented"),
    ],
)
def test_distributed_optimizer_refuses(kwargs: dict[str, Any], error: str) -> None:
    import peloton.horovod.torch as hvd

    sgd = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match=error):
        hvd.DistributedOptimizer(sgd, **kwargs)
    assert type(sgd) is torch.optim.SGD


# ---- op constants and build queries ---------------------------------------------------------


def numpy_ops() -> dict[str, Any]:
    import peloton.collective as pc

    x = np.array([pc.rank() + 2.0])
    names = ("Sum", "Average", "Min", "Max", "Product")
    out = {op: pc.allreduce(x, op=getattr(pc, op)).tolist() for op in names}
    strings = {op: pc.allreduce(x, op=op.lower()).tolist() for op in names}
    assert strings == out
    try:
        pc.allreduce(x, op=pc.Adasum)
    except ValueError as exc:
        out["adasum"] = str(exc)
    return out


def test_op_constants_are_accepted_wherever_op_is() -> None:
    import peloton.horovod.torch as hvd

    assert [hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product] == [
        "average", "sum", "min", "max", "product",
    ]  # fmt: skip
    for res in assert_all_ok(run_ranks(numpy_ops, 3)):
        assert res == {
            "Sum": [9.0], "Average": [3.0], "Min": [2.0], "Max": [4.0], "Product": [24.0],
            "adasum": res["adasum"],
        }  # fmt: skip
        assert "use op=Average" in res["adasum"]


def test_build_queries_answer_truthfully() -> None:
    import peloton.collective as pc
    import peloton.horovod.torch as hvd

    # NCCL is loaded at run time: "built" is whether it loads here (libnccl.so.2 is absent on a
    # CPU-only machine), and then it is NCCL's version code.
    version = hvd.nccl_built()
    assert isinstance(version, int) and bool(version) == pc._nccl_loads()[0] == hvd.cuda_built()
    assert not any(
        q()
        for q in (
            hvd.gloo_built, hvd.gloo_enabled, hvd.mpi_built, hvd.mpi_enabled,
            hvd.ddl_built, hvd.ccl_built, hvd.rocm_built,
        )
    )  # fmt: skip
    with pytest.raises(ValueError, match="does not use MPI"):
        hvd.mpi_threads_supported()
    assert hvd.is_initialized() is False


def test_horovod_module_has_horovods_torch_names() -> None:
    import peloton.collective.torch as pct
    import peloton.horovod.torch as hvd

    names = [
        *("init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank"),
        *("local_rank", "cross_rank", "Average", "Sum", "Adasum", "Min", "Max", "Product"),
        *("Compression", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_"),
        *("grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async"),
        *("grouped_allreduce_async_", "allgather", "broadcast", "broadcast_", "poll"),
        *("synchronize", "barrier", "DistributedOptimizer", "broadcast_parameters"),
        *("broadcast_optimizer_state", "SyncBatchNorm", "nccl_built", "gloo_built"),
        *("gloo_enabled", "mpi_built", "mpi_enabled", "mpi_threads_supported", "ddl_built"),
        *("ccl_built", "cuda_built", "rocm_built"),
    ]
    assert all(getattr(hvd, n) is getattr(pct, n) for n in names)


# ---- SyncBatchNorm --------------------------------------------------------------------------


def batch() -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(3)
    # A mean far from zero next to the spread, to show the statistics do not cancel badly.
    return torch.randn(8, 3, 4, 4, generator=g) * 2 + 5, torch.randn(8, 3, 4, 4, generator=g)


def batch_norm(bn: Any, x: Any, weights: Any) -> dict[str, Any]:
    """Trains ``bn`` one step on ``x`` (loss: the sum of its outputs times ``weights``), then
    evaluates it; what it computed, as NumPy arrays (tensors do not cross processes well)."""
    x = x.clone().requires_grad_()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.0, -1.0, 3.0]))
    y = bn(x)
    (y * weights).sum().backward()
    bn.eval()
    found = {
        "y": y,
        "x.grad": x.grad,
        "weight.grad": bn.weight.grad,
        "bias.grad": bn.bias.grad,
        "running_mean": bn.running_mean,
        "running_var": bn.running_var,
        "eval": bn(x),
    }
    return {k: v.detach().numpy() for k, v in found.items()}


def sync_bn() -> dict[str, Any]:
    import peloton.horovod.torch as hvd

    single_threaded()

    x, weights = batch()
    mine = [t.chunk(hvd.size())[hvd.rank()] for t in (x, weights)]
    return batch_norm(hvd.SyncBatchNorm(3, momentum=None), *mine)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_sync_batch_norm_matches_batch_norm_on_the_whole_batch(n: int) -> None:
    want = batch_norm(torch.nn.BatchNorm2d(3, momentum=None), *batch())
    got = assert_all_ok(run_ranks(sync_bn, n, start_method="spawn"))
    close = {"rtol": 1e-5, "atol": 1e-5}
    for key in ("y", "x.grad", "eval"):
        np.testing.assert_allclose(np.concatenate([g[key] for g in got]), want[key], **close)
    for key in ("weight.grad", "bias.grad"):  # each rank's part: DistributedOptimizer sums them
        np.testing.assert_allclose(sum(g[key] for g in got), want[key], **close)
    for g in got:
        for key in ("running_mean", "running_var"):
            np.testing.assert_allclose(g[key], want[key], **close)
