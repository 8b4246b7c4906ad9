"""A linear head with softmax cross-entropy whose first and second derivatives are closed-form and
chunked over tokens.

At the seed models' vocabularies (50k–131k) the logits dominate a language model's
double-backward graph: autograd keeps the logits, their softmax, the gradient of the logits and
its own second-order intermediates, several ``[tokens, vocab]`` tensors per batch.
:func:`linear_cross_entropy` computes

    L = (1/T) Σ_t [logsumexp(z_t) − z_t[y_t]],      z_t = W h_t + b,

and its derivatives without keeping any ``[tokens, vocab]`` tensor beyond one chunk of tokens:

- forward: per chunk, z_c (in the inputs' dtype, then float32, as ``F.cross_entropy`` on upcast
  logits does) → loss and the per-token log-sum-exp (T floats kept);
- backward (differentiable once more): per chunk, dz = (g/T)(softmax(z_c) − e_y) →
  ∂L/∂h = dz W, ∂L/∂W = Σ dzᵀ h, ∂L/∂b = Σ dz;
- second order, closed form: for cotangents (a_h, a_W, a_b) on those gradients, with the logit
  direction u = a_h Wᵀ + h a_Wᵀ + a_b and the softmax Jacobian J = (g/T)(p ⊙ u − p (p·u)) per
  token: ∂/∂h = J W + dz a_W, ∂/∂W = Jᵀ h + dzᵀ a_h, ∂/∂b = Σ J, ∂/∂g = ⟨softmax − e_y, u⟩/T.

Memory: the saved h, W, b, targets and T log-sum-exps; temporaries of ``chunk × vocab`` floats.
Cost: each pass recomputes the chunk's logits (one extra ``T × d × V`` matmul per pass). Third
derivatives are not provided (``once_differentiable``: asking for one raises). It serves the
``"reverse"`` HVP backend; it has no forward-mode rule, so the ``"forward"`` backend uses plain
autograd. Equal to the autograd Hessian to float64 rounding (tests/test_linear_ce.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

__all__ = ["linear_cross_entropy", "default_chunk", "transient_bytes"]


def default_chunk(vocab: int) -> int:
    """Tokens per chunk so that one ``[chunk, vocab]`` float32 temporary is about 16 MB."""
    return max(1, (1 << 22) // max(1, vocab))


#: ``[chunk, vocab]`` temporaries alive at once: about 1 while the gradient is built and 2.5 in
#: the second backward (losslens.geometry.memory.graphs.peak_new_bytes on the head alone), 4 in a whole
#: model's HVP (the head's input gradient chunks besides; GPT-NeoX 14M–160M shapes)
CHUNK_TEMPORARIES = 4


def transient_bytes(tokens: int, vocab: int, dtype: torch.dtype, chunk: int | None = None) -> int:
    """Bytes of the head's chunk temporaries for ``tokens`` rows (any batch size beyond one
    chunk costs the same): ``CHUNK_TEMPORARIES × min(chunk, tokens) × vocab`` numbers in the
    softmax dtype."""
    rows = min(int(tokens), chunk or default_chunk(vocab))
    return CHUNK_TEMPORARIES * rows * int(vocab) * torch.empty((), dtype=_cdt(dtype)).element_size()


def _cdt(dtype: torch.dtype) -> torch.dtype:
    """Softmax arithmetic: float32 for half-precision inputs (as the LM loss upcasts logits), else the dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _logits(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    z = h @ W.T
    if b is not None:
        z = z + b
    return z.to(_cdt(h.dtype))


def _probs_minus_onehot(z: torch.Tensor, lse: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """softmax(z) − onehot(y), computed in z's storage (z is a fresh chunk of logits)."""
    p = z.sub_(lse[:, None]).exp_()
    p[torch.arange(len(y), device=y.device), y] -= 1.0
    return p


def _accumulate_outer(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``out += aᵀ b`` in place (``out`` in the softmax dtype, a/b in the inputs' dtype): no
    ``W``-sized temporary."""
    if a.dtype == out.dtype:
        out.addmm_(a.T, b)
    else:
        out.addmm_(a.T.to(out.dtype), b.to(out.dtype))


class _LinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, W, b, y, chunk):
        T = h.shape[0]
        lse = torch.empty(T, dtype=_cdt(h.dtype), device=h.device)
        total = torch.zeros((), dtype=torch.float64, device=h.device)
        for s in range(0, T, chunk):
            z = _logits(h[s : s + chunk], W, b)
            lse[s : s + chunk] = torch.logsumexp(z, dim=1)
            total += (lse[s : s + chunk] - z.gather(1, y[s : s + chunk, None])[:, 0]).sum(dtype=torch.float64)
        ctx.save_for_backward(h, W, b if b is not None else torch.empty(0, device=h.device), y, lse)
        ctx.has_bias, ctx.chunk = b is not None, chunk
        return (total / T).to(_cdt(h.dtype))

    @staticmethod
    def backward(ctx, g):
        h, W, b, y, lse = ctx.saved_tensors
        b = b if ctx.has_bias else None
        gh, gW, gb = _LinearCEGrad.apply(h, W, b, y, lse, g, ctx.chunk)
        return gh, gW, gb, None, None


class _LinearCEGrad(torch.autograd.Function):
    """(∂L/∂h, ∂L/∂W, ∂L/∂b) · g as a function of (h, W, b, g), with its closed-form derivative."""

    @staticmethod
    def forward(ctx, h, W, b, y, lse, g, chunk):
        T, cdt = h.shape[0], _cdt(h.dtype)
        scale = g.to(cdt) / T
        gh = torch.empty_like(h)
        gW = torch.zeros(W.shape, dtype=cdt, device=W.device)
        gb = torch.zeros(W.shape[0], dtype=cdt, device=W.device) if b is not None else None
        for s in range(0, T, chunk):
            hc = h[s : s + chunk]
            dz = _probs_minus_onehot(_logits(hc, W, b), lse[s : s + chunk], y[s : s + chunk]).mul_(scale)
            dzc = dz.to(h.dtype)
            torch.mm(dzc, W, out=gh[s : s + chunk])
            _accumulate_outer(gW, dzc, hc)
            if gb is not None:
                gb += dz.sum(0)
            del dz, dzc
        ctx.save_for_backward(h, W, b if b is not None else torch.empty(0, device=h.device), y, lse, g)
        ctx.has_bias, ctx.chunk = b is not None, chunk
        return gh, gW.to(W.dtype), (gb.to(b.dtype) if gb is not None else None)

    @staticmethod
    @once_differentiable
    def backward(ctx, a_h, a_W, a_b):
        h, W, b, y, lse, g = ctx.saved_tensors
        b = b if ctx.has_bias else None
        T, chunk, cdt = h.shape[0], ctx.chunk, _cdt(h.dtype)
        scale = g.to(cdt) / T
        a_h = torch.zeros_like(h) if a_h is None else a_h
        a_W = torch.zeros_like(W) if a_W is None else a_W
        out_h = torch.empty_like(h)
        out_W = torch.zeros(W.shape, dtype=cdt, device=W.device)
        out_b = torch.zeros(W.shape[0], dtype=cdt, device=W.device) if b is not None else None
        out_g = torch.zeros((), dtype=torch.float64, device=h.device)
        # per chunk, in place where it can be: p, u, dz (then dz·scale), J, and one product temporary
        # of [chunk, vocab]; nothing of W's size besides out_W
        for s in range(0, T, chunk):
            hc, ahc = h[s : s + chunk], a_h[s : s + chunk]
            p = _logits(hc, W, b).sub_(lse[s : s + chunk, None]).exp_()
            u = torch.mm(ahc, W.T).addmm_(hc, a_W.T).to(cdt)  # the logit-space direction
            if a_b is not None:
                u += a_b.to(cdt)
            dz = p.clone()
            dz[torch.arange(len(hc), device=h.device), y[s : s + chunk]] -= 1.0
            for r in range(0, len(hc), 16):  # float64 sums of 16 rows: on CPU a float64
                out_g += (dz[r : r + 16] * u[r : r + 16]).sum(dtype=torch.float64) / T  # sum casts its input
            J = u.mul_(p)  # p ⊙ u, in u's storage
            J.sub_(p.mul_(J.sum(1, keepdim=True))).mul_(scale)  # (p ⊙ u − p (p·u)) · scale
            del p
            dzs = dz.mul_(scale).to(h.dtype)
            Jc = J.to(h.dtype)
            oh = torch.mm(Jc, W, out=out_h[s : s + chunk])
            oh.addmm_(dzs, a_W)
            _accumulate_outer(out_W, Jc, hc)
            _accumulate_outer(out_W, dzs, ahc)
            if out_b is not None:
                out_b += J.sum(0)
            del dz, dzs, J, Jc, u
        return (
            out_h,
            out_W.to(W.dtype),
            out_b.to(b.dtype) if out_b is not None else None,
            None,
            None,
            out_g.to(g.dtype),
            None,
        )


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Mean cross-entropy (nats; a float32 scalar for half-precision inputs, else their dtype) of the
    logits ``hidden @ weight.T + bias``.

    Args:
        hidden: ``[T, d]`` inputs of the head (any float dtype).
        weight: ``[V, d]`` head matrix; bias: optional ``[V]``.
        targets: ``[T]`` int64 class indices.
        chunk: tokens per chunk (default :func:`default_chunk`).
    Twice differentiable in closed form (module docstring); logits are never stored whole.
    """
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden [T, d] and weight [V, d] must agree on d; got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if targets.shape != (hidden.shape[0],):
        raise ValueError(f"targets must be [T] = [{hidden.shape[0]}], got {tuple(targets.shape)}")
    return _LinearCE.apply(hidden, weight, bias, targets.long(), chunk or default_chunk(weight.shape[0]))
