"""Batch normalization over the whole gang's batch, as Horovod's ``SyncBatchNorm``.

In training, every rank normalizes its shard with the mean and variance of the union of all
ranks' shards (one allreduce of per-channel sums per call), so N ranks of batch b compute what
one process computes on the batch of N·b; the gradients flow back through that allreduce to
every rank's inputs. Needs torch, like the torch layer.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

import peloton.collective as pc

__all__ = ["SyncBatchNorm"]


class _AllreduceSum(torch.autograd.Function):
    """A sum across ranks whose gradient is the sum of every rank's gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return pc.allreduce(tensor, op=pc.Sum)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        # Every rank's output depends on every rank's input: each rank's input gets them all.
        return pc.allreduce(grad, op=pc.Sum)


class SyncBatchNorm(_BatchNorm):
    """``torch.nn.BatchNorm{1,2,3}d`` with the statistics of the whole gang's batch.

    Takes input of shape ``(N, C, ...)``. In training with more than one rank the batch
    statistics are the gang's (running statistics too, so they are the same on every rank);
    in evaluation, or alone, it is the ordinary batch norm. Every rank must call it the same
    number of times in the same order, forward and backward, as any collective. Unlike
    Horovod's it also runs on CPU tensors.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm: expected input of 2 or more dims, got {input.dim()}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize ``input`` (see the class doc for which statistics)."""
        self._check_input_dim(input)
        factor = 0.0
        if self.training and self.track_running_stats:
            assert self.num_batches_tracked is not None
            self.num_batches_tracked.add_(1)
            # momentum None: a cumulative average, as torch's BatchNorm.
            factor = (
                1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            )
        if not self.training or pc.size() == 1:
            return F.batch_norm(
                input,
                self.running_mean,
                self.running_var,
                self.weight,
                self.bias,
                self.training or not self.track_running_stats,
                factor,
                self.eps,
            )
        return self._synced(input, factor)

    def _synced(self, x: torch.Tensor, factor: float) -> torch.Tensor:
        channels = x.shape[1]
        dims = [0, *range(2, x.dim())]
        # Sums and sums of squares travel in float64: the variance is E[x²] - E[x]², which
        # cancels badly in float32 when the mean is large next to the spread.
        wide = x.double()
        count = wide.new_tensor([x.numel() // channels])
        totals: torch.Tensor = _AllreduceSum.apply(  # type: ignore[no-untyped-call]
            torch.cat([wide.sum(dims), (wide * wide).sum(dims), count])
        )
        n = totals[-1]
        mean = totals[:channels] / n
        var = totals[channels : 2 * channels] / n - mean * mean
        shape = [1, channels] + [1] * (x.dim() - 2)
        y: torch.Tensor = (x - mean.to(x.dtype).view(shape)) * torch.rsqrt(
            var.to(x.dtype).view(shape) + self.eps
        )
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            assert self.running_mean is not None and self.running_var is not None
            with torch.no_grad():
                unbiased = var * (n / (n - 1))  # as torch's BatchNorm keeps it
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)
        return y
