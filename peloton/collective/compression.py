"""Gradient compression for :mod:`peloton.collective.torch`, with Horovod's interface.

A compressor turns a tensor into what travels (``compress`` returns it and a context) and the
reduced result back (``decompress``). ``Compression.fp16`` sends floating-point tensors as
float16, half the bytes of float32 on the wire; the runtime reduces them in float16 and the
result is cast back to the tensor's own dtype. Needs torch, like the torch layer.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """Horovod's compressor interface: static ``compress`` and ``decompress``."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor to send and the context :meth:`decompress` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The reduced tensor as the caller's: ``ctx`` is what :meth:`compress` returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (integers as they are)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """The compressors by Horovod's names: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
