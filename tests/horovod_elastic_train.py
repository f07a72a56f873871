"""An elastic training script written the way Horovod's PyTorch elastic examples are (the
elastic mnist / imagenet scripts), with the one line that makes it peloton's: the ``hvd`` import.

Run by tests/test_collective_horovod_elastic.py under ``peloton-run --elastic`` and by
tests/test_elastic_e2e.py as a scheduled elastic gang. Each rank prints ``batch <epoch> <batch>
<index>...`` for every batch it trained on, ``committed`` after every commit it returned from and
``reset <size> lr <lr> at <epoch> <batch>`` after every re-form (the position the gang goes on
from: the last commit after a failure, the kept state after a membership change, which a commit
that raised HostsUpdatedInterrupt had saved), so the test can tell which batches' updates were
kept.
With ``--kill-after-batch K`` the rank that started as rank 2 SIGKILLs itself after the commit
at batch K of epoch 0. With ``--gate FILE --gate-at K`` rank 0 waits for FILE before batch K of
epoch 0 (the gang can grow meanwhile, and re-forms at the next commit: in the middle of the epoch).
At the end every rank saves its weights to ``--out``/rank<R>.pt.
"""

import argparse
import os
import signal
import time

import torch
import torch.nn.functional as F

import peloton.horovod.torch as hvd  # the only peloton line: was `import horovod.torch as hvd`

parser = argparse.ArgumentParser(description="PyTorch Horovod elastic-style example")
parser.add_argument("--out", required=True, help="directory for each rank's final weights")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=36)
parser.add_argument("--batch-size", type=int, default=2, help="per-rank batch size")
parser.add_argument("--batches-per-commit", type=int, default=2)
parser.add_argument("--kill-after-batch", type=int, default=-1)
parser.add_argument("--base-lr", type=float, default=0.01)
parser.add_argument(
    "--gate", help="before batch --gate-at of epoch 0, rank 0 waits until this file exists"
)
parser.add_argument("--gate-at", type=int, default=0)
args = parser.parse_args()

torch.manual_seed(42)
torch.set_num_threads(1)

hvd.init()
started_as = hvd.rank()

features = torch.randn(args.samples, 10)
labels = torch.randint(0, 4, (args.samples,))
dataset = torch.utils.data.TensorDataset(torch.arange(args.samples), features, labels)

# Elastic Horovod: use ElasticSampler to partition data among workers.
train_sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
train_loader = torch.utils.data.DataLoader(
    dataset, batch_size=args.batch_size, sampler=train_sampler
)

model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
# Horovod: scale learning rate by the number of GPUs.
optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def train(state):
    """One epoch over what the sampler has left of it."""
    model.train()
    for batch_idx, (index, data, target) in enumerate(train_loader):
        if args.gate and hvd.rank() == 0 and state.epoch == 0 and state.batch == args.gate_at:
            while not os.path.exists(args.gate):  # a test's hook: the gang grows meanwhile
                time.sleep(0.05)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        indices = " ".join(str(int(i)) for i in index)
        print(f"batch {state.epoch} {state.batch} {indices}", flush=True)
        # Elastic Horovod: record which samples were processed this batch
        # so we do not reprocess them if a reset event occurs.
        state.train_sampler.record_batch(batch_idx, args.batch_size)
        state.batch += 1
        if state.batch % args.batches_per_commit == 0:
            state.commit()
            print("committed", flush=True)
            if started_as == 2 and state.epoch == 0 and state.batch == args.kill_after_batch:
                print("killed", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)


def end_epoch(state):
    state.epoch += 1
    state.batch = 0
    state.train_sampler.set_epoch(state.epoch)
    state.commit()
    print("committed", flush=True)


@hvd.elastic.run
def full_train(state):
    while state.epoch < args.epochs:
        train(state)
        end_epoch(state)


# Elastic Horovod: reset the learning rate after the gang changed size.
def on_state_reset():
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.base_lr * hvd.size()
    lr = optimizer.param_groups[0]["lr"]
    print(f"reset {hvd.size()} lr {lr:g} at {state.epoch} {state.batch}", flush=True)


state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=0, batch=0)
state.register_reset_callbacks([on_state_reset])
full_train(state)
torch.save(model.state_dict(), os.path.join(args.out, f"rank{started_as}.pt"))
print(f"final epoch {state.epoch}", flush=True)
