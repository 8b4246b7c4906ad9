"""How much memory one Hessian-vector product takes: the double-backward graph, measured.

:meth:`losslens.geometry.operators.hessian.HessianOperator.pass_bytes` predicts the peak of one product from the
bytes autograd saves for a batch's forward and ``create_graph`` backward, counted with saved-tensor
hooks on a one-row copy of the batch (parameters and buffers excluded: they are resident) and
scaled by the rows. The transient of the second backward is a fitted multiple of that graph
(benchmarks/README.md, "Scale", checks the model against measured peaks).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

#: Transient of one second backward beyond its result (one gradient's worth of Hv), as a multiple
#: of the batch's saved graph: the activation gradients flowing back through the graph. Fitted on
#: the GPT-NeoX 14M/70M/160M shapes with every allocation tracked (peak_new_bytes; 0.43–0.49).
#: Validated range: GPT-NeoX 14M–160M shapes (benchmarks/README.md "Scale", peak RSS against the
#: plan); on GPT-NeoX, Llama and OLMo-2 (SwiGLU) shapes of hidden 128 × 6 layers and 512 × 2 layers
#: (4 × 64 tokens, float32) one pass's peak RSS stayed below the plan: 0.67–0.82 of it with glibc's
#: defaults (``python -m benchmarks.scale --factors``), 0.83–0.87 with freed memory returned to the
#: OS (GPT-NeoX and OLMo-2 at 128 × 6): the head's chunk temporaries and this transient do not peak
#: together there.
SECOND_BACKWARD_FACTOR = 0.45
#: The same for one tangent of the forward backend (forward, gradient and their tangents), beyond
#: 3 gradients. Measured (peak RSS of one product with freed memory returned to the OS, ≈ its live
#: tensors; 4 × 64 tokens, float32, the plain loss): GPT-NeoX 1.49–1.50, Llama 1.53–1.74, OLMo-2
#: 1.66–1.86 at hidden 128 × 6 layers and 512 × 2 layers (vocabulary 50,304); 1.9 covers all of
#: them (the pass is then 0.77–0.99 of the plan; 0.68–0.88 of it with glibc's defaults). Validated
#: on these shapes only. It was 3.0, never measured, which planned the pass 1.6× too large.
FORWARD_FACTOR = 1.9


def one_row(batch: Any) -> tuple[int, Any, Any]:
    """``(rows, one-row copy, shape key)`` of a batch: a tensor or a tuple/list of tensors sharing
    their first dimension; anything else is measured whole (rows = 1). A copy, not a view: saved
    inputs count with their whole storage."""
    sliced = first_rows(batch, 1)
    if sliced is None:
        return 1, batch, ("whole", id(batch))
    if isinstance(batch, torch.Tensor):
        return batch.shape[0], sliced, ("t", tuple(batch.shape[1:]), batch.dtype)
    return batch[0].shape[0], sliced, ("s",) + tuple((tuple(t.shape[1:]), t.dtype) for t in batch)


def first_rows(batch: Any, n: int) -> Any | None:
    """A copy of the first ``n`` rows of a batch (a tensor, or a tuple/list of tensors sharing
    their first dimension, of at least ``n`` rows), or None for a batch of any other kind."""
    if isinstance(batch, torch.Tensor) and batch.ndim >= 1 and batch.shape[0] >= n:
        return batch[:n].clone()
    if (
        isinstance(batch, (tuple, list))
        and batch
        and all(isinstance(t, torch.Tensor) and t.ndim >= 1 for t in batch)
        and len({t.shape[0] for t in batch}) == 1
        and batch[0].shape[0] >= n
    ):
        return type(batch)(t[:n].clone() for t in batch)
    return None


def saved_graph_bytes(model: nn.Module, build: Callable[[], Any]) -> int:
    """Bytes of the tensors autograd saves while ``build()`` runs a forward and a ``create_graph``
    backward (storages counted once; the model's parameters and buffers excluded)."""
    resident = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in resident:
                seen[ptr] = st.nbytes()
        except (RuntimeError, NotImplementedError):  # tensor subclasses without a plain storage
            seen[id(t)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        build()
    return int(sum(seen.values()))


def pass_bytes(
    graphs: list[int], grad_bytes: int, vectorize: bool, k: int, chunk: int, cached: bool, transient: int = 0
) -> int:
    """Predicted peak of one reverse-over-reverse product of k vectors beyond its input and output,
    from each batch's graph bytes (``graphs``, gradients included), the bytes of one gradient
    (``grad_bytes``) and the loss's own temporaries (``transient``, independent of the batch size):
    the live graph(s) (the largest batch, or every batch when ``cached``) + the second backward's
    transient (its result, one gradient, + :data:`SECOND_BACKWARD_FACTOR` × saved graph + the
    loss's temporaries), × the chunk when vmapped.
    """
    saved_max = max(graphs) - grad_bytes
    live = sum(graphs) if cached else max(graphs)
    c = min(k, chunk) if vectorize else 1
    return int(live + c * (SECOND_BACKWARD_FACTOR * saved_max + grad_bytes + transient))


def forward_pass_bytes(graphs: list[int], grad_bytes: int, k: int, chunk: int, transient: int = 0) -> int:
    """The same for the forward-over-reverse backend: chunk × (:data:`FORWARD_FACTOR` × the largest
    saved graph + 3 gradients + the loss's temporaries)."""
    saved_max = max(graphs) - grad_bytes
    return int(min(k, chunk) * (FORWARD_FACTOR * saved_max + 3 * grad_bytes + transient))


def peak_new_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``(fn(), peak bytes)``: the most bytes held at one time by tensors that ``fn``'s operations
    allocate (storages counted once, freed when their last view dies; tensors that existed before,
    such as parameters, are not counted). What a no-grad forward needs beyond the resident model:
    its activations, the logits and the loss's temporaries. Measured with a ``TorchDispatchMode``
    (every op's outputs, any device), so it costs one ``fn()`` plus Python per op."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class _Live(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live: dict[int, int] = {}
            self.now = self.peak = 0

        def _free(self, ptr: int) -> None:
            self.now -= self.live.pop(ptr, 0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = {_ptr(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                    continue
                st = t.untyped_storage()
                ptr = _ptr(t)
                if ptr == 0 or ptr in before or ptr in self.live:
                    continue
                self.live[ptr] = st.nbytes()
                self.now += st.nbytes()
                self.peak = max(self.peak, self.now)
                weakref.finalize(st, self._free, ptr)
            return out

    def _ptr(t: torch.Tensor) -> int:
        """The storage address, 0 for wrappers without one (functorch's batched and dual tensors:
        the dense tensors they wrap are counted when their ops allocate them)."""
        try:
            return t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return 0

    mode = _Live()
    with mode:
        result = fn()
    return result, int(mode.peak)
