"""When may a kept gradient graph be reused? A fingerprint of a model's tensors.

:class:`~losslens.geometry.operators.hessian.HessianOperator` keeps every batch's double-backward graph
between calls when ``cache_graphs`` is on. The graph is the Hessian *at the weights it was built
on*, so it must be dropped as soon as any parameter or buffer of the model changes. Autograd's
version counter (``t._version``) does not see every change a user can make:

- ``p.data.copy_(x)``, ``p.data.mul_(s)``: ``.data`` is a new tensor with its own version counter,
  so ``p._version`` stays the same (the quantizers wrote weights this way: issue #23, a cached
  product after in-place quantization was 31–76% off);
- ``p.data = other`` keeps ``p`` (same ``id``) and, once ``other``'s storage is reused for a
  later tensor, possibly the same ``data_ptr``;
- ``load_state_dict(..., assign=True)`` replaces the Parameter objects.

:func:`model_fingerprint` therefore records, per parameter and buffer, its identity, storage
address, version, dtype and shape **and a content checksum**: the exact int64 sum of the tensor's
bit pattern read as int16 words (any change of one element changes it) and a float64 sum weighted
by a fixed position pattern (so a permutation of elements changes it). Two equal fingerprints mean
the tensors hold the same bits, up to a deliberate collision of both sums.

Cost: one read of every parameter and buffer per call (O(model size), no autograd), in chunks of
:data:`CHUNK` elements, so the temporaries stay below ~3 MB whatever the tensor size. Computed once
per product call (not per batch or vector), and only when graphs are kept. Measured
(``python -m benchmarks.hvp_throughput --fingerprint``, benchmarks/README.md "HVP throughput"):
3.2–4.6 ms per million parameters on one CPU thread, 1.0% (NeoX-1M) and 2.9% (NeoX-9M) of one
gradient of 8 × 128 tokens, against the ≈ 2.3 gradients of each Hessian-vector product.
"""

from __future__ import annotations

import torch
from torch import nn

#: elements per checksum chunk (int16 words: 4 per float64 element, 2 per float32)
CHUNK = 1 << 18

_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def _weights(device: torch.device) -> torch.Tensor:
    """A fixed float64 position pattern of length :data:`CHUNK` (1 + (i·7919 mod 1009)/1009)."""
    w = _WEIGHTS.get(device)
    if w is None:
        i = torch.arange(CHUNK, dtype=torch.int64, device=device)
        w = _WEIGHTS[device] = 1.0 + ((i * 7919) % 1009).to(torch.float64) / 1009
    return w


def content_checksum(t: torch.Tensor) -> tuple[int, float]:
    """``(exact sum of the int16 words of t's bytes, position-weighted float64 sum of those words)``.

    Any tensor dtype (bool and 1-byte types are widened first); a DTensor contributes its local
    shard, a sparse tensor its dense form. Reads ``t`` once, chunk by chunk.
    """
    x = t.detach()
    if hasattr(x, "to_local"):  # a DTensor (FSDP2 shard): this rank's shard
        x = x.to_local()
    if x.layout != torch.strided:
        x = x.to_dense()
    if x.dtype == torch.bool or x.element_size() == 1:
        x = x.to(torch.int16)
    if x.is_complex():
        x = torch.view_as_real(x)
    flat = x.contiguous().reshape(-1)
    words = flat.view(torch.int16) if flat.numel() else flat.to(torch.int16)
    w = _weights(words.device)
    exact = torch.zeros((), dtype=torch.int64, device=words.device)
    mixed = torch.zeros((), dtype=torch.float64, device=words.device)
    for start in range(0, words.numel(), CHUNK):
        part = words[start : start + CHUNK]
        exact += part.sum(dtype=torch.int64)
        mixed += torch.dot(part.to(torch.float64), w[: part.numel()]) * (1 + (start // CHUNK) % 4093)
    return int(exact), float(mixed)


def model_fingerprint(model: nn.Module, content: bool = True) -> tuple:
    """Hashable state of every parameter and buffer of ``model``: identity, storage address,
    version, dtype, shape and (``content``) :func:`content_checksum`. Equal fingerprints: a graph
    built on the first state is valid for the second. Cost: see the module docstring."""
    ts = list(model.parameters()) + list(model.buffers())
    return tuple(
        (id(t), t.data_ptr(), t._version, t.dtype, tuple(t.shape), content_checksum(t) if content else None) for t in ts
    )
