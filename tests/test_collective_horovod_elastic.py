"""Horovod's elastic names on peloton: a Horovod-elastic-style script under
``peloton-run --elastic`` that loses a rank, and ElasticSampler's re-sharding in one process."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import peloton.horovod.torch as hvd  # noqa: E402  (after the skip: it needs torch)
from peloton.horovod.torch.elastic import ElasticSampler, TorchState  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "horovod_elastic_train.py"
SAMPLES = 36
RUN_TIMEOUT_S = 120


def committed_batches(stdout: str, rank: str) -> list[tuple[int, list[int]]]:
    """The batches ``rank`` trained on whose updates the gang kept: those before its last
    ``committed``, and at a re-form those before the position the gang goes on from (a commit
    that raised HostsUpdatedInterrupt kept its batches without printing ``committed``; a
    failure rolled back to the last commit). Batches after that are dropped, as at its death."""
    kept: list[tuple[int, list[int]]] = []
    pending: list[tuple[int, int, list[int]]] = []
    for line in re.findall(rf"^\[{rank}\] (.*)$", stdout, re.M):
        if line.startswith("batch "):
            epoch, batch, *index = map(int, line.split()[1:])
            pending.append((epoch, batch, index))
        elif line == "committed":
            kept += [(epoch, index) for epoch, _, index in pending]
            pending = []
        elif line.startswith("reset "):
            at = tuple(map(int, line.split(" at ")[1].split()))
            kept += [(epoch, index) for epoch, batch, index in pending if (epoch, batch) < at]
            pending = []
        elif line == "killed":
            pending = []
    return kept


def padding(stdout: str, first_size: int) -> int:
    """The most samples an ElasticSampler may train twice in one epoch of a gang that started
    with ``first_size`` ranks: each sharding pads the shards to one length (at most size - 1
    extra samples), and there is one sharding at the start and one per re-form (``reset``)."""
    resets: dict[str, list[int]] = {}
    for rank, n in re.findall(r"^\[(\d+)\] reset (\d+) ", stdout, re.M):
        resets.setdefault(rank, []).append(int(n))  # every rank of a generation prints it
    return first_size - 1 + max((sum(n - 1 for n in ns) for ns in resets.values()), default=0)


def test_a_horovod_elastic_script_loses_a_rank_and_trains_on_every_sample_once(
    tmp_path: Path,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "peloton.collective.run", "--elastic", "--min", "2", "--max", "3",
         "-np", "3", sys.executable, str(SCRIPT), "--out", str(tmp_path), "--samples",
         str(SAMPLES), "--kill-after-batch", "4"],
        cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert re.findall(r"^\[(\d+)\] killed$", out, re.M) == ["2"], out
    survivors = sorted(re.findall(r"^\[(\d+)\] final epoch 2$", out, re.M))
    assert survivors == ["0", "1"], out
    # The reset callback rescaled the learning rate to the new size on each survivor, once.
    assert sorted(re.findall(r"^\[(\d)\] reset (\d+ lr \S+)", out, re.M)) == [
        ("0", "2 lr 0.02"),
        ("1", "2 lr 0.02"),
    ], out
    # Epoch 0 was trained on by 3 ranks, then its remaining samples by 2: every sample of every
    # epoch once across the ranks (the victim's committed batches included).
    seen: dict[int, Counter[int]] = {0: Counter(), 1: Counter()}
    for rank in ("0", "1", "2"):
        for epoch, index in committed_batches(out, rank):
            seen[epoch].update(index)
    for epoch, counts in seen.items():
        assert counts == Counter(range(SAMPLES)), (epoch, counts, out)
    # Epoch 0 had batches at both sizes: the victim trained on some before it died.
    assert any(line for line in re.findall(r"^\[2\] batch 0 .*$", out, re.M)), out
    weights = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in survivors]
    assert weights[0].keys() == weights[1].keys()
    for k in weights[0]:
        assert torch.equal(weights[0][k], weights[1][k]), k


def test_elastic_sampler_reshards_the_remaining_indices_over_the_new_size() -> None:
    dataset = list(range(30))
    three = [ElasticSampler(dataset, seed=3, num_replicas=3, rank=r) for r in range(3)]
    shards = [list(s) for s in three]
    assert all(len(s) == 10 == len(sampler) for s, sampler in zip(shards, three, strict=True))
    assert sorted(i for s in shards for i in s) == dataset  # a permutation, split three ways
    assert shards != [dataset[r::3] for r in range(3)]  # shuffled
    # Each rank processes its first two batches of 2.
    for s in three:
        s.record_batch(0, 2)
        s.record_batch(1, 2)
    done = set().union(*(s.processed_indices for s in three))
    assert done == {i for s in shards for i in s[:4]}
    # A rank is lost: the gang's union of processed indices is loaded at size 2.
    two = [ElasticSampler(dataset, seed=3, num_replicas=2, rank=r) for r in range(2)]
    for s in two:
        s.load_state_dict({"epoch": 0, "processed_indices": done})
    rest = [list(s) for s in two]
    assert [len(s) for s in rest] == [9, 9]
    assert sorted(i for s in rest for i in s) == sorted(set(dataset) - done)
    assert two[1].get_indices(1, 2) == rest[1][2:4]
    # The next epoch starts afresh: everything, shuffled differently, over the current size.
    two[0].set_epoch(1)
    assert two[0].processed_indices == set()
    assert len(two[0]) == 15 and list(two[0]) != rest[0]


def test_elastic_sampler_pads_an_uneven_shard_and_reset_takes_a_new_size() -> None:
    sampler = ElasticSampler(list(range(7)), shuffle=False, num_replicas=2, rank=1)
    assert list(sampler) == [1, 3, 5, 0]  # padded from the start to 4 per rank
    sampler.record_indices([1, 3])
    sampler.reset(num_replicas=3, rank=2)
    assert list(sampler) == [4, 0]  # 0 2 4 5 6 (+0) over 3: rank 2 gets 4 and the pad
    with pytest.raises(ValueError, match=r"rank 3 is not in 0\.\.2"):
        sampler.reset(num_replicas=3, rank=3)


def test_torch_state_keeps_the_sampler_object_and_restores_its_processed_indices() -> None:
    model = torch.nn.Linear(2, 1)
    sampler = ElasticSampler(list(range(8)), num_replicas=2, rank=0)
    state = TorchState(model, None, train_sampler=sampler, epoch=0, batch=0)
    list(sampler)
    sampler.record_batch(0, 2)
    state.batch = 1
    state.commit()  # outside elastic.run: one process, no gang to unite the records with
    first = set(sampler.processed_indices)
    sampler.record_batch(1, 2)
    state.batch = 2
    state.restore()
    assert state.train_sampler is sampler and state.batch == 1
    assert sampler.processed_indices == first and len(sampler) == 3


def test_the_horovod_elastic_names() -> None:
    from peloton.collective import elastic

    assert hvd.elastic.run is elastic.run
    assert hvd.elastic.HostsUpdatedInterrupt is elastic.HostsUpdatedInterrupt
    assert hvd.elastic.ObjectState is elastic.State
    assert hvd.elastic.TorchState is TorchState and hvd.elastic.ElasticSampler is ElasticSampler
    state = hvd.elastic.ObjectState(epoch=3)
    state.epoch = 4
    state.restore()
    assert state.epoch == 3


def test_torch_state_commits_and_restores_a_learning_rate_scheduler_in_place() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    state = TorchState(model, optimizer, scheduler=scheduler, epoch=0)
    assert state.scheduler is scheduler  # the same object, not a copy
    optimizer.step()
    scheduler.step()
    state.commit()
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.0625
    state.restore()
    assert scheduler.last_epoch == 1
    # The scheduler's next step goes on from the committed epoch.
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.25
