"""A training script written the way Horovod's PyTorch examples are (its synthetic benchmark and
mnist), with the one line that makes it peloton's: the ``hvd`` import.

Run by tests/test_collective_horovod.py under ``peloton-run -np N``; every rank trains on its
shard of the same seeded batches and saves its final weights to ``--out``/rank<R>.pt.
"""

import argparse
import os

import torch
import torch.nn.functional as F

import peloton.horovod.torch as hvd  # the only peloton line: was `import horovod.torch as hvd`

parser = argparse.ArgumentParser(description="PyTorch Horovod-style example")
parser.add_argument("--out", required=True, help="directory for each rank's final weights")
parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression in allreduce")
parser.add_argument(
    "--use-adasum", action="store_true", help="use Adasum algorithm to do reduction"
)
parser.add_argument(
    "--gradient-predivide-factor", type=float, default=1.0, help="apply gradient predivide factor"
)
parser.add_argument("--batches-per-allreduce", type=int, default=1)
parser.add_argument("--batch-size", type=int, default=16, help="global batch size")
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

torch.manual_seed(42)
torch.set_num_threads(1)

hvd.init()
assert hvd.is_initialized()
assert 0 <= hvd.local_rank() < hvd.local_size() and 0 <= hvd.rank() < hvd.size()

# Build queries, as Horovod scripts use them to pick a path.
assert not (hvd.gloo_built() or hvd.mpi_built() or hvd.ddl_built() or hvd.ccl_built())
assert not hvd.rocm_built() and hvd.cuda_built() == bool(hvd.nccl_built())


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(10, 32)
        self.bn = hvd.SyncBatchNorm(32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.bn(self.fc1(x))))


model = Net()

# By default, Adasum doesn't need scaling up learning rate.
lr_scaler = hvd.size() if not args.use_adasum else 1
if args.use_adasum and hvd.nccl_built():
    # If using GPU Adasum allreduce, scale learning rate by local_size.
    lr_scaler = hvd.local_size()
# The reference (one rank) sees the whole batch: the same per-sample step at any size.
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler / hvd.size(), momentum=0.9)

# Horovod: broadcast parameters & optimizer state.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

# Horovod: (optional) compression algorithm.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

# Horovod: wrap optimizer with DistributedOptimizer.
optimizer = hvd.DistributedOptimizer(
    optimizer,
    named_parameters=model.named_parameters(),
    compression=compression,
    backward_passes_per_step=args.batches_per_allreduce,
    op=hvd.Adasum if args.use_adasum else hvd.Average,
    gradient_predivide_factor=args.gradient_predivide_factor,
)

# The same seeded data on every rank; each takes its contiguous shard, as DistributedSampler.
data = torch.Generator().manual_seed(7)
batches = [
    (
        torch.randn(args.batch_size, 10, generator=data),
        torch.randint(0, 4, (args.batch_size,), generator=data),
    )
    for _ in range(args.steps)
]


def metric_average(val: float, name: str) -> float:
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


model.train()
seen = 0
for step, (x, y) in enumerate(batches):
    optimizer.zero_grad()
    # The batch's sub-batches of one allreduce each; every rank takes its shard of each one
    # (so SyncBatchNorm sees the same rows as the one-process reference).
    k = args.batches_per_allreduce
    for mx, my in zip(x.chunk(k), y.chunk(k), strict=True):
        mx, my = mx.chunk(hvd.size())[hvd.rank()], my.chunk(hvd.size())[hvd.rank()]
        loss = F.cross_entropy(model(mx), my) / k
        loss.backward()
        seen += len(my)
    optimizer.step()
    loss_avg = metric_average(loss.item(), f"loss.{step}")
    if hvd.rank() == 0:
        print(f"step {step}: loss {loss_avg:.4f}")

# Whole-gang metrics: one grouped allreduce of (samples, ranks), summed.
total, count = hvd.grouped_allreduce(
    [torch.tensor([float(seen)]), torch.tensor([1.0])],
    op=hvd.Sum,
    name="samples",
    compression=compression,
)
assert count.item() == hvd.size() and total.item() == args.batch_size * args.steps
assert hvd.allreduce(torch.tensor([hvd.rank()]), op=hvd.Max).item() == hvd.size() - 1
assert hvd.allreduce(torch.tensor([hvd.rank() + 1]), op=hvd.Min).item() == 1
assert hvd.allreduce(torch.tensor([2.0]), op=hvd.Product).item() == 2.0 ** hvd.size()
# The weights every rank ends with must be rank 0's exactly.
rank0 = hvd.broadcast(model.fc1.weight.detach(), root_rank=0, name="final.fc1")
assert torch.equal(rank0, model.fc1.weight.detach())

torch.save(model.state_dict(), os.path.join(args.out, f"rank{hvd.rank()}.pt"))
hvd.shutdown()
