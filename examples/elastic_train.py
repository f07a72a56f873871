"""An elastic data-parallel torch trainer: it trains on however many ranks its gang has, and goes
on when ranks join or leave (the job file: examples/elastic-torch.yaml).

As the command of an elastic job (``gang: {min_instances, max_instances}``) every task joins its
gang's rendezvous endpoint (``PELOTON_RENDEZVOUS``, set by the scheduler). Training runs inside
``elastic.run``: when the gang grows (a task started in freed capacity) or shrinks (a task
preempted or lost), every rank stops at its next ``state.commit()``, the gang re-forms at its new
size with rank 0's model, optimizer and data position (``TorchState``), and training goes on. A
rank that dies takes the others back to the last commit. The data of each epoch is sharded over
the ranks by an ``ElasticSampler``, which re-shards what the epoch has left after a re-form, so
every sample of an epoch is trained on once, whatever the gang's size. The learning rate follows
the gang's size (a reset callback).

It prints, on every rank: ``rank R/N: lr X`` at each (re-)forming of the gang, ``epoch E loss L
(N ranks)`` at the end of each epoch (the loss on all the data, the same on every rank), and
``rank R done: E epochs, loss L, accuracy A`` at the end. A task that starts after the gang
finished leaves at once (exit 0).

Runs without a scheduler too, e.g. ``peloton-run --elastic --min 2 --max 4 -np 2 python
examples/elastic_train.py``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import peloton.collective.torch as pct
from peloton.collective import elastic
from peloton.collective.sampler import ElasticSampler


def make_data(n: int, seed: int = 0) -> torch.utils.data.TensorDataset:
    """A synthetic classification task: 4 classes of points around 4 centres in 16 dimensions."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 16, generator=g)
    labels = torch.randint(0, 4, (n,), generator=g)
    points = centres[labels] + 1.5 * torch.randn(n, 16, generator=g)
    return torch.utils.data.TensorDataset(points, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02, help="for one rank; times the ranks")
    parser.add_argument("--batches-per-commit", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)  # the same initial model everywhere (rank 0's is given to all anyway)
    torch.set_num_threads(1)
    dataset = make_data(args.samples)
    sampler = ElasticSampler(dataset, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Gradients are averaged over the gang's ranks, whatever its size at the time.
    optimizer = pct.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    def scale_lr() -> None:
        """After every re-form (a reset callback): the learning rate of the new size."""
        for group in optimizer.param_groups:
            group["lr"] = args.lr * pct.size()
        print(f"rank {pct.rank()}/{pct.size()}: lr {args.lr * pct.size():g}", flush=True)

    def evaluate() -> tuple[float, float]:
        with torch.no_grad():
            points, labels = dataset.tensors
            out = model(points)
            accuracy = (out.argmax(dim=1) == labels).float().mean().item()
            return F.cross_entropy(out, labels).item(), accuracy

    # Everything a re-formed gang resumes from: rank 0's model, optimizer and data position.
    state = pct.TorchState(model, optimizer, train_sampler=sampler, epoch=0, batch=0)
    state.register_reset_callbacks([scale_lr])

    started = False

    @elastic.run
    def train(state: pct.TorchState) -> int:
        nonlocal started
        if not started:  # the first generation (the callback runs after re-forms only)
            started = True
            scale_lr()
        while state.epoch < args.epochs:
            # This rank's share of what the epoch has left (re-sharded after a re-form).
            for batch_idx, (points, labels) in enumerate(loader):
                optimizer.zero_grad()
                F.cross_entropy(model(points), labels).backward()
                optimizer.step()
                state.train_sampler.record_batch(batch_idx, args.batch_size)
                state.batch += 1
                if state.batch % args.batches_per_commit == 0:
                    state.commit()  # a re-form, if the gang changed, happens here
            loss, _ = evaluate()
            print(f"epoch {state.epoch} loss {loss:.4f} ({pct.size()} ranks)", flush=True)
            state.epoch += 1
            state.batch = 0
            state.train_sampler.set_epoch(state.epoch)
            state.commit()
        return pct.rank()

    rank = train(state)  # a task drained, or started after the gang finished, exits 0 here
    loss, accuracy = evaluate()
    print(f"rank {rank} done: {state.epoch} epochs, loss {loss:.4f}, accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
