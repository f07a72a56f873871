"""Every collective, op and dtype against NumPy, for 1 to 5 real rank processes on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from collective_support import assert_all_ok, run_ranks
from hypothesis import given, settings
from hypothesis import strategies as st

import peloton.collective as pc

DTYPES = ["float32", "float64", "float16", "int32", "int64"]
OPS = ["sum", "average", "min", "max", "product"]
# Odd sizes: empty, fewer elements than ranks, not divisible by any N, and big enough to chunk.
SIZES = [0, 1, 3, 1001, 100_003]


def data(rank: int, dtype: str, n: int, seed: int) -> np.ndarray:
    """Deterministic per-rank input; small positive integers keep sums/products exact in fp16."""
    rng = np.random.default_rng(seed * 1000 + rank)
    return rng.integers(1, 4, size=n).astype(dtype)


def expected(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    """What every rank should get, computed the obvious way."""
    stack = np.stack([a.astype(np.float64) for a in arrays])
    dtype = arrays[0].dtype
    if op in ("sum", "average"):
        out = stack.sum(axis=0)
        if op == "average":
            out = out / len(arrays)
            if dtype.kind == "i":
                out = np.trunc(out)
    elif op == "min":
        out = stack.min(axis=0)
    elif op == "max":
        out = stack.max(axis=0)
    else:
        out = stack.prod(axis=0)
    return out


def tolerance(dtype: np.dtype[Any]) -> float:
    return {"float16": 2e-3, "bfloat16": 1e-2}.get(dtype.name, 1e-6)


# ---------------------------------------------------------------- rank bodies (run in children)


def all_allreduces(sizes: list[int]) -> dict[str, Any]:
    """Each (dtype, op, size) allreduce, the in-place variant, and the 2-D shape case."""
    out: dict[str, Any] = {}
    r = pc.rank()
    for dtype in DTYPES:
        for op in OPS:
            for n in sizes:
                x = data(r, dtype, n, seed=n)
                before = x.copy()
                y = pc.allreduce(x, op=op, name=f"{dtype}.{op}.{n}")
                assert y.dtype == x.dtype and y.shape == x.shape
                assert np.array_equal(x, before), "allreduce modified its input"
                out[f"{dtype}.{op}.{n}"] = y
        z = data(r, dtype, 15, seed=7).reshape(3, 5)
        assert pc.allreduce_(z, op="sum", name=f"inplace.{dtype}") is z
        out[f"inplace.{dtype}"] = z
    return out


def gathers_broadcasts_scatters() -> dict[str, Any]:
    r, n = pc.rank(), pc.size()
    out: dict[str, Any] = {}
    # allgather: rank r contributes r rows (rank 0 none), three columns
    out["allgather"] = pc.allgather(np.full((r, 3), r, dtype=np.int64), name="ag")
    out["allgather.f16"] = pc.allgather(np.arange(r + 1, dtype=np.float16))
    for root in range(n):
        x = data(r, "float32", 1001, seed=root)
        out[f"bcast.{root}"] = pc.broadcast(x, root_rank=root)
        y = data(r, "int32", 7, seed=root + 50)
        assert pc.broadcast_(y, root_rank=root) is y
        out[f"bcast_.{root}"] = y
    for rows in (7, 2, 0):
        x = data(r, "float64", rows * 3, seed=rows).reshape(rows, 3)
        out[f"rs.{rows}"] = pc.reduce_scatter(x, op="sum")
    out["rs.avg"] = pc.reduce_scatter(data(r, "float32", 10, seed=3), op="average")
    pc.barrier()
    return out


def any_order(names: list[str]) -> dict[str, Any]:
    """Submits async allreduces in a rank-specific order, then synchronizes them all."""
    r = pc.rank()
    order = list(names)
    np.random.default_rng(r).shuffle(order)
    handles = {
        name: pc.allreduce_async(data(r, "float32", 50 + i, seed=i), op="sum", name=name)
        for i, name in ((names.index(nm), nm) for nm in order)
    }
    assert all(isinstance(pc.poll(h), bool) for h in handles.values())
    return {name: pc.synchronize(h) for name, h in handles.items()}


def torch_tensors() -> dict[str, Any]:
    import torch

    r = pc.rank()
    out: dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        t = torch.arange(11, dtype=torch.float32).to(dtype) + r
        y = pc.allreduce(t, op="sum", name=f"t.{dtype}")
        assert isinstance(y, torch.Tensor) and y.dtype == dtype
        out[f"allreduce.{dtype}"] = y.to(torch.float64).numpy()
    t = torch.ones(4, 3)[:, 1]  # non-contiguous view: the result must land in it
    pc.allreduce_(t, op="sum")
    out["inplace"] = t.numpy().copy()
    g = pc.allgather(torch.full((r + 1, 2), float(r), dtype=torch.bfloat16))
    out["allgather"] = g.to(torch.float64).numpy()
    return out


def identity() -> dict[str, int]:
    return {
        "rank": pc.rank(),
        "size": pc.size(),
        "local_rank": pc.local_rank(),
        "local_size": pc.local_size(),
        "cross_rank": pc.cross_rank(),
        "cross_size": pc.cross_size(),
        "initialized": int(pc.is_initialized()),
    }


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_allreduce_every_dtype_and_op_matches_numpy(n: int) -> None:
    sizes = SIZES if n in (1, 3, 5) else SIZES[:4]
    results = assert_all_ok(run_ranks(all_allreduces, n, sizes))
    for dtype in DTYPES:
        for op in OPS:
            for size in sizes:
                key = f"{dtype}.{op}.{size}"
                want = expected(op, [data(r, dtype, size, seed=size) for r in range(n)])
                for r, res in enumerate(results):
                    got = res[key]
                    tol = tolerance(got.dtype)
                    assert np.allclose(got.astype(np.float64), want, rtol=tol, atol=tol), (
                        f"rank {r} {key}"
                    )
        want = expected("sum", [data(r, dtype, 15, seed=7) for r in range(n)]).reshape(3, 5)
        for res in results:
            assert np.array_equal(res[f"inplace.{dtype}"].astype(np.float64), want)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_allgather_broadcast_reduce_scatter_match_numpy(n: int) -> None:
    results = assert_all_ok(run_ranks(gathers_broadcasts_scatters, n))
    gathered = np.concatenate([np.full((r, 3), r, dtype=np.int64) for r in range(n)])
    f16 = np.concatenate([np.arange(r + 1, dtype=np.float16) for r in range(n)])
    for r, res in enumerate(results):
        assert res["allgather"].shape == (n * (n - 1) // 2, 3)
        assert np.array_equal(res["allgather"], gathered)
        assert res["allgather.f16"].dtype == np.float16
        assert np.array_equal(res["allgather.f16"], f16)
        for root in range(n):
            assert np.array_equal(res[f"bcast.{root}"], data(root, "float32", 1001, seed=root))
            assert np.array_equal(res[f"bcast_.{root}"], data(root, "int32", 7, seed=root + 50))
        for rows in (7, 2, 0):
            full = sum(data(q, "float64", rows * 3, seed=rows).reshape(rows, 3) for q in range(n))
            splits = np.array_split(np.asarray(full).reshape(rows, 3), n)
            assert np.array_equal(res[f"rs.{rows}"], splits[r]), f"rank {r} rows {rows}"
        avg = sum(data(q, "float32", 10, seed=3) for q in range(n)) / n
        assert np.allclose(res["rs.avg"], np.array_split(avg, n)[r], rtol=1e-6)


@pytest.mark.parametrize("n", [2, 4])
def test_ranks_may_submit_in_different_orders(n: int) -> None:
    names = [f"grad.{i}" for i in range(12)]
    results = assert_all_ok(run_ranks(any_order, n, names))
    for i, name in enumerate(names):
        want = sum(data(r, "float32", 50 + i, seed=i) for r in range(n))
        for res in results:
            assert np.array_equal(res[name], want)


def test_torch_cpu_tensors_keep_their_type_and_dtype() -> None:
    pytest.importorskip("torch")
    results = assert_all_ok(run_ranks(torch_tensors, 3))
    ar = np.arange(11, dtype=np.float64) * 3 + 3
    for res in results:
        for key in ("float32", "bfloat16", "float16", "int64"):
            assert np.allclose(res[f"allreduce.torch.{key}"], ar, rtol=1e-2)
        assert np.array_equal(res["inplace"], np.full(4, 3.0, dtype=np.float32))
        assert np.array_equal(
            res["allgather"], np.concatenate([np.full((r + 1, 2), r) for r in range(3)])
        )


def shm_allreduces() -> dict[str, Any]:
    """Allreduces on the shared-memory (and hierarchical) path, one bigger than a 4 MiB slot."""
    r = pc.rank()
    out: dict[str, Any] = {}
    for dtype in DTYPES:
        for op in OPS:
            out[f"{dtype}.{op}"] = pc.allreduce(data(r, dtype, 1001, seed=1), op=op)
    out["big"] = pc.allreduce(data(r, "float32", 1_100_003, seed=2), op="sum")
    out["empty"] = pc.allreduce(np.empty((0, 4), np.float64), op="max")
    handles = [pc.allreduce_async(data(r, "int64", i, seed=i), op="sum") for i in range(1, 9)]
    out["fused"] = [pc.synchronize(h) for h in handles]
    return out


@pytest.mark.parametrize(("n", "local_size"), [(3, 3), (4, 2)])
def test_shared_memory_and_hierarchical_allreduce_match_numpy(n: int, local_size: int) -> None:
    """(3, 3): one host, shared memory only; (4, 2): 2 hosts x 2 ranks, hierarchical."""
    results = assert_all_ok(run_ranks(shm_allreduces, n, local_size=local_size))
    for dtype in DTYPES:
        for op in OPS:
            want = expected(op, [data(r, dtype, 1001, seed=1) for r in range(n)])
            for res in results:
                got = res[f"{dtype}.{op}"].astype(np.float64)
                tol = tolerance(np.dtype(dtype))
                assert np.allclose(got, want, rtol=tol, atol=tol), f"{dtype}.{op}"
    big = sum(data(r, "float32", 1_100_003, seed=2) for r in range(n))
    for res in results:
        assert np.array_equal(res["big"], big)
        assert res["empty"].shape == (0, 4)
        for i, got in enumerate(res["fused"], start=1):
            assert np.array_equal(got, sum(data(r, "int64", i, seed=i) for r in range(n)))


def half_precision_sums() -> dict[str, Any]:
    """Sums of random 16-bit floats, subnormals, infinities and NaN included."""
    import torch

    r = pc.rank()
    rng = np.random.default_rng(r)
    specials = np.array([0.0, -0.0, 6e-8, -6e-8, 1e-5, 65504.0, np.inf, -np.inf, np.nan])
    values = np.concatenate([rng.normal(0, 100, 4000), rng.normal(0, 1e-5, 1000), specials])
    out: dict[str, Any] = {"f16": pc.allreduce(values.astype(np.float16), op="sum")}
    bf = pc.allreduce(torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16), op="sum")
    out["bf16"] = bf.float().numpy()
    return out


def test_float16_and_bfloat16_sums_round_like_numpy_and_torch() -> None:
    """Each rank's 16-bit values widen to float32, add, and round to nearest even once."""
    torch = pytest.importorskip("torch")
    results = assert_all_ok(run_ranks(half_precision_sums, 2))
    inputs = []
    for r in range(2):
        rng = np.random.default_rng(r)
        specials = np.array([0.0, -0.0, 6e-8, -6e-8, 1e-5, 65504.0, np.inf, -np.inf, np.nan])
        inputs.append(
            np.concatenate([rng.normal(0, 100, 4000), rng.normal(0, 1e-5, 1000), specials])
        )
    with np.errstate(over="ignore"):  # 65504 + 65504 overflows to inf, as it should
        f16 = inputs[0].astype(np.float16).astype(np.float32) + inputs[1].astype(np.float16)
        f16 = f16.astype(np.float16)
    bf = [torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).float() for x in inputs]
    want_bf = (bf[0] + bf[1]).to(torch.bfloat16).float().numpy()
    for res in results:
        assert np.array_equal(res["f16"], f16, equal_nan=True)
        assert np.array_equal(res["bf16"], want_bf, equal_nan=True)


def test_topology_comes_from_the_environment() -> None:
    results = assert_all_ok(run_ranks(identity, 4, local_size=2))
    for r, res in enumerate(results):
        assert res == {
            "rank": r,
            "size": 4,
            "local_rank": r % 2,
            "local_size": 2,
            "cross_rank": r // 2,
            "cross_size": 2,
            "initialized": 1,
        }


def test_runtime_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import peloton.collective as pc, numpy as np\n"
        "pc.init(rank=0, size=1, peers=['127.0.0.1:1'])\n"
        "print(pc.allreduce(np.ones(3, np.float32), op='sum').tolist())\n"
        "pc.shutdown()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[1.0, 1.0, 1.0]"


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(-1000, 1000), min_size=0, max_size=40),
    st.sampled_from(OPS),
    st.sampled_from(["int32", "int64", "float64"]),
)
def test_single_rank_allreduce_is_identity_property(values: list[int], op: str, dtype: str) -> None:
    """With one rank every op returns its input (average divides by 1), in any dtype."""
    pc.init(rank=0, size=1, peers=["127.0.0.1:1"], timeout=5)
    try:
        x = np.array(values, dtype=dtype)
        assert np.array_equal(pc.allreduce(x, op=op), x)
        assert np.array_equal(pc.allgather(x.reshape(-1, 1)).ravel(), x)
        assert np.array_equal(pc.reduce_scatter(x), x)
    finally:
        pc.shutdown()
