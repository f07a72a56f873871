"""peloton.collective.torch: data-parallel training across real processes.

The ranks are real processes started by ``peloton-run`` that talk over loopback through the C++
runtime; this file is also their program (``python tests/test_collective_torch.py SCENARIO OUT``).
Each rank trains on its shard of every batch and saves its parameters; the test trains the same
model on the full batches in one process and compares.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch") if __name__ != "__main__" else __import__("torch")

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
BATCH = 24  # divisible by 1, 2, 3 and 4 ranks
STEPS = 6
LR = 0.1
CLIP = 0.05  # gradient norm bound, below the norms of this model's gradients
RUN_TIMEOUT_S = 90


# ---- the model and data, shared by the ranks and the reference ----------------------------


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 3),
    )
    # An unused layer: it gets no gradient on any rank and must not stall the allreduce.
    model.add_module("unused", torch.nn.Linear(2, 2))
    return model


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    return [
        (torch.randn(BATCH, 8, generator=g), torch.randint(0, 3, (BATCH,), generator=g))
        for _ in range(STEPS)
    ]


def forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.Sequential(*list(model.children())[:5])(x)


def make_optimizer(model: torch.nn.Module, lr: float = LR) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def train(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    shard: Callable[[torch.Tensor], torch.Tensor],
    micro_batches: int = 1,
    clip: float | None = None,
) -> None:
    """Train on ``shard`` of every batch, in ``micro_batches`` backward passes per step,
    clipping the (reduced) gradients' norm to ``clip``."""
    loss_fn = torch.nn.CrossEntropyLoss()
    for x, y in batches():
        xs, ys = shard(x), shard(y)
        optimizer.zero_grad()
        for mx, my in zip(xs.chunk(micro_batches), ys.chunk(micro_batches), strict=True):
            (loss_fn(forward(model, mx), my) / micro_batches).backward()
        if clip is None:
            optimizer.step()
            continue
        distributed = hasattr(optimizer, "skip_synchronize")
        if distributed:
            optimizer.synchronize()  # type: ignore[attr-defined]
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        with optimizer.skip_synchronize() if distributed else contextlib.nullcontext():  # type: ignore[attr-defined]
            optimizer.step()


def reference(micro_batches: int = 1, clip: float | None = None) -> dict[str, torch.Tensor]:
    """One process, full batches: what every rank must end with."""
    model = make_model(seed=0)
    train(model, make_optimizer(model), lambda t: t, micro_batches, clip)
    return model.state_dict()


# ---- the rank program -----------------------------------------------------------------------


def rank_main(scenario: str, out: Path) -> None:
    import peloton.collective.torch as pct

    pct.init()
    rank, size = pct.rank(), pct.size()

    def shard(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(size)[rank]

    if scenario == "train":
        # Plain steps, accumulation over two backward passes per step, gradient clipping.
        for variant, k, clip in (("1", 1, None), ("2", 2, None), ("clip", 1, CLIP)):
            model = make_model(seed=rank)  # differs per rank until the broadcast
            optimizer = pct.DistributedOptimizer(
                make_optimizer(model),
                named_parameters=model.named_parameters(),
                backward_passes_per_step=k,
            )
            pct.broadcast_parameters(model.state_dict(), root_rank=0)
            torch.save(model.state_dict(), out / f"initial{variant}.{rank}.pt")
            train(model, optimizer, shard, micro_batches=k, clip=clip)
            torch.save(model.state_dict(), out / f"final{variant}.{rank}.pt")
        # Only the root has stepped (momentum buffers) and its learning rate differs.
        model = make_model(seed=0)
        plain = make_optimizer(model, lr=0.5 if rank == 0 else LR)
        if rank == 0:
            train(model, plain, lambda t: t)
        pct.broadcast_optimizer_state(plain, root_rank=0)
        torch.save(plain.state_dict(), out / f"optimizer{rank}.pt")
    elif scenario == "die":
        # Rank 1 dies after the first step; the others must raise, not hang.
        model = make_model(seed=0)
        optimizer = pct.DistributedOptimizer(make_optimizer(model))
        loss_fn = torch.nn.CrossEntropyLoss()
        for step, (x, y) in enumerate(batches()):
            if rank == 1 and step == 1:
                os._exit(9)
            optimizer.zero_grad()
            loss_fn(forward(model, shard(x)), shard(y)).backward()
            try:
                optimizer.step()
            except pct.CollectiveError as exc:
                print(f"rank {rank} step {step}: CollectiveError: {exc}", flush=True)
                os._exit(0)
        raise SystemExit("the step after rank 1 died did not raise")
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    pct.shutdown()


# ---- the tests ------------------------------------------------------------------------------


def test_distributed_optimizer_is_the_same_optimizer_extended() -> None:
    import peloton.collective.torch as pct

    model = make_model(seed=0)
    sgd = make_optimizer(model)
    opt = pct.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    assert opt is sgd
    assert isinstance(opt, torch.optim.SGD) and isinstance(opt, pct.DistributedOptimizer)
    assert type(opt).__name__ == "DistributedSGD"
    assert opt.state_dict() == make_optimizer(make_model(seed=0)).state_dict()
    with pytest.raises(ValueError, match="already a DistributedOptimizer"):
        pct.DistributedOptimizer(opt)
    opt.remove_hooks()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"op": "max"}, "op: must be one of average, sum"),
        ({"backward_passes_per_step": 0}, "backward_passes_per_step: must be at least 1"),
        ({"named_parameters": [("a", None)] * 2}, "name 'a' appears twice"),
        ({"named_parameters": []}, "8 of the optimizer's parameters have no name"),
    ],
)
def test_distributed_optimizer_argument_errors(kwargs: dict[str, object], error: str) -> None:
    import peloton.collective.torch as pct

    sgd = make_optimizer(make_model(seed=0))
    with pytest.raises(ValueError, match=error):
        pct.DistributedOptimizer(sgd, **kwargs)  # type: ignore[arg-type]
    assert type(sgd) is torch.optim.SGD  # a refusal leaves the optimizer as it was


def run_ranks(n: int, scenario: str, out: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "peloton.collective.run",
            "-np",
            str(n),
            "--timeout",
            "30",
            sys.executable,
            str(HERE),
            scenario,
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def load(path: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return state


def assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def trained(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, Path]:
    """Runs the "train" program once per rank count; the tests below read what it saved."""
    n: int = request.param
    out = tmp_path_factory.mktemp(f"train{n}")
    run_ranks(n, "train", out)
    return n, out


def test_sharded_training_matches_one_process_on_the_full_batch(trained: tuple[int, Path]) -> None:
    n, out = trained
    want_initial = make_model(seed=0).state_dict()
    want_final = reference()
    # The parameters did move, so equality below is not trivial.
    assert not torch.allclose(want_final["0.weight"], want_initial["0.weight"])
    for r in range(n):
        assert_close(load(out / f"initial1.{r}.pt"), want_initial)
        assert_close(load(out / f"final1.{r}.pt"), want_final)


def test_gradient_accumulation_over_backward_passes(trained: tuple[int, Path]) -> None:
    n, out = trained
    want = reference(micro_batches=2)
    for r in range(n):
        assert_close(load(out / f"final2.{r}.pt"), want)


def test_gradient_clipping_between_synchronize_and_step(trained: tuple[int, Path]) -> None:
    n, out = trained
    want = reference(clip=CLIP)
    assert not torch.allclose(want["0.weight"], reference()["0.weight"]), "clipping clipped"
    for r in range(n):
        assert_close(load(out / f"finalclip.{r}.pt"), want)


def test_broadcast_optimizer_state_gives_every_rank_the_roots(trained: tuple[int, Path]) -> None:
    n, out = trained
    root = torch.load(out / "optimizer0.pt", weights_only=True)
    assert root["state"], "the root optimizer has momentum buffers"
    assert root["param_groups"][0]["lr"] == 0.5
    for r in range(1, n):
        got = torch.load(out / f"optimizer{r}.pt", weights_only=True)
        assert got["param_groups"] == root["param_groups"]
        assert got["state"].keys() == root["state"].keys()
        for key, buffers in root["state"].items():
            for name, value in buffers.items():
                torch.testing.assert_close(got["state"][key][name], value, msg=f"{key}.{name}")


def test_a_dead_rank_makes_step_raise_on_the_others(tmp_path: Path) -> None:
    """Without peloton-run (which would stop them): the survivors see the error themselves."""
    from peloton.collective.run import RankSeat, local_free_ports, rank_env

    n = 3
    peers = [f"127.0.0.1:{p}" for p in local_free_ports(n)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE), "die", str(tmp_path)],
            cwd=REPO,
            env={
                **os.environ,
                **rank_env(RankSeat(r, "localhost", r, n, 0, 1), n, peers, timeout=5),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(n)
    ]
    try:
        outputs = [p.communicate(timeout=RUN_TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert procs[1].returncode == 9
    for r in (0, 2):
        assert procs[r].returncode == 0, outputs[r]
        assert f"rank {r} step 1: CollectiveError" in outputs[r]
        assert "missing ranks [1]" in outputs[r]


def test_example_trains_under_peloton_run() -> None:
    proc = subprocess.run(
        [
            sys.executable, "-m", "peloton.collective.run", "-np", "2", "--timeout", "30",
            sys.executable, "examples/train_torch.py", "--epochs", "2", "--samples", "2048",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["[0] epoch 1/2", "[0] epoch 2/2"]
    assert all("2 ranks on cpu" in line for line in lines)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    rank_main(sys.argv[1], Path(sys.argv[2]))
