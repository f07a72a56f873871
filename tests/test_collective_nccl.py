"""NCCL path: a real NCCL allreduce of torch CUDA tensors where a CUDA GPU exists.

Skipped only when there is no CUDA GPU (torch's CPU build counts as none). With one GPU a
single-rank communicator runs (NCCL refuses two ranks on one device); with more, one rank per GPU.
The build-side checks (the extension loads NCCL lazily and reports why it cannot) run everywhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from collective_support import assert_all_ok, run_ranks

import peloton.collective as pc
from peloton.collective import _core

torch = pytest.importorskip("torch")
HAS_GPU = bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU on this machine")


def test_nccl_is_loaded_lazily_and_explains_itself() -> None:
    ok, why = _core.nccl_available()
    assert isinstance(ok, bool)
    assert ok or "NCCL" in why or "CUDA" in why, why


def cuda_collectives() -> dict[str, Any]:
    r, n = pc.rank(), pc.size()
    dev = torch.device("cuda", pc.local_rank())
    torch.cuda.set_device(dev)
    out: dict[str, Any] = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
        x = (torch.arange(1001, device=dev) % 7 + r).to(dtype)
        y = pc.allreduce(x, op="sum", name=f"nccl.{dtype}")
        assert y.is_cuda and y.dtype == dtype
        out[f"sum.{dtype}"] = y.double().cpu().numpy()
    z = torch.full((5,), float(r + 1), device=dev)
    assert pc.allreduce_(z, op="average") is z
    out["avg"] = z.cpu().numpy()
    b = torch.full((3,), float(r), device=dev)
    out["bcast"] = pc.broadcast(b, root_rank=n - 1).cpu().numpy()
    g = pc.allgather(torch.full((r + 1, 2), float(r), device=dev))
    out["gather"] = g.cpu().numpy()
    return out


@needs_gpu
def test_real_nccl_allreduce_of_cuda_tensors() -> None:
    n = min(4, torch.cuda.device_count())
    results = assert_all_ok(run_ranks(cuda_collectives, n, local_size=n, timeout=60))
    base = np.arange(1001) % 7
    for res in results:
        for key in ("float32", "float16", "bfloat16", "int64"):
            want = n * base + sum(range(n))
            assert np.allclose(res[f"sum.torch.{key}"], want, rtol=1e-2), key
        assert np.allclose(res["avg"], np.full(5, (n + 1) / 2))
        assert np.array_equal(res["bcast"], np.full(3, float(n - 1)))
        want_g = np.concatenate([np.full((r + 1, 2), float(r)) for r in range(n)])
        assert np.array_equal(res["gather"], want_g)
