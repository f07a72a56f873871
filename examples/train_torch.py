"""A small single-GPU-style training script, made data-parallel with peloton in a few lines.

Run it as 2 ranks on this machine::

    peloton-run -np 2 python examples/train_torch.py --epochs 5

or as the command of a peloton job (the scheduler sets the same PELOTON_* environment), or alone
(``python examples/train_torch.py``: one rank). Each rank trains on its own shard of the data; the
gradients are averaged across ranks during backward. On a machine with GPUs each rank uses the
GPU of its local rank (the runtime then reduces over NCCL), otherwise the CPU.

The lines marked ``# peloton`` are all it takes.
"""

from __future__ import annotations

import argparse
import time

import torch

import peloton.collective.torch as pct  # peloton


def make_data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic classification task: 3 classes of points around 3 centres in 16 dimensions."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(3, 16, generator=g) * 0.4
    labels = torch.randint(0, 3, (n,), generator=g)
    points = centres[labels] + torch.randn(n, 16, generator=g)
    return points, labels


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 3),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by ranks")
    parser.add_argument("--samples", type=int, default=8192)
    args = parser.parse_args()

    pct.init()  # peloton: rank, size and peers from the PELOTON_* environment
    if torch.cuda.is_available():
        device = torch.device("cuda", pct.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # the ranks share this machine's cores

    x, y = make_data(args.samples)
    # peloton: each rank takes every size()-th sample, starting at its rank.
    x, y = x[pct.rank() :: pct.size()].to(device), y[pct.rank() :: pct.size()].to(device)

    torch.manual_seed(pct.rank())  # different on purpose: the broadcast below aligns them
    model = make_model().to(device)
    # The effective batch is size() times larger, so is the usual learning rate.
    optimizer: torch.optim.Optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr * pct.size(), momentum=0.9
    )
    optimizer = pct.DistributedOptimizer(  # peloton
        optimizer, named_parameters=model.named_parameters()
    )
    pct.broadcast_parameters(model.state_dict(), root_rank=0)  # peloton
    pct.broadcast_optimizer_state(optimizer, root_rank=0)  # peloton

    loss_fn = torch.nn.CrossEntropyLoss()
    steps = len(x) // args.batch_size
    for epoch in range(args.epochs):
        started = time.perf_counter()
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        total = torch.zeros(1, device=device)
        for step in range(steps):
            batch = order[step * args.batch_size : (step + 1) * args.batch_size].to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            total += loss.detach()
        # peloton: the mean loss over all ranks, for the log line.
        mean = pct.allreduce(total / max(steps, 1), op="average", name="epoch_loss")
        with torch.no_grad():
            correct = (model(x).argmax(dim=1) == y).float().mean().reshape(1)
        accuracy = pct.allreduce(correct, op="average", name="epoch_accuracy")
        if pct.rank() == 0:
            print(
                f"epoch {epoch + 1}/{args.epochs}: loss {float(mean):.4f} "
                f"accuracy {float(accuracy):.3f} ({time.perf_counter() - started:.2f} s, "
                f"{pct.size()} ranks on {device.type})",
                flush=True,
            )
    pct.shutdown()  # peloton


if __name__ == "__main__":
    main()
