"""Tiny, seeded models and data shared by the whole test suite.

Every factory is deterministic in its ``seed`` and small enough that an exact Hessian (one double
backward per parameter, :func:`losslens.geometry.operators.dense.exact_hessian`) builds in about a second:

==================  ============================================  ==========
factory             architecture                                  parameters
==================  ============================================  ==========
``tiny_mlp``        Linear(5,12)-LayerNorm-Tanh-Linear(12,8)-      227
                    GELU-Linear(8,3), cross-entropy on 3 classes
``micro_gptneox``   GPTNeoXForCausalLM, hidden 4, 2 heads,        488
                    2 layers, LayerNorm, GELU MLP 8, vocab 17
``micro_llama``     LlamaForCausalLM, hidden 4, 2 heads (1 KV),   444
                    2 layers, RMSNorm, SiLU-gated MLP 8, vocab 17
==================  ============================================  ==========

LM batches are ``[batch, seq]`` LongTensors from :func:`random_batches`; the LM loss is :func:`lm_loss`
(:func:`losslens.lm.core.next_token_loss.lm_loss`, kept in float64 for float64 models). MLP batches are ``(x [b, 5], y
[b])`` tuples from
:func:`mlp_batches` with :func:`mlp_loss` (mean cross-entropy). Models are returned in eval mode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 17
CONTEXT = 32
MLP_IN, MLP_CLASSES = 5, 3


def tiny_mlp(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    """A 227-parameter MLP (with a LayerNorm) mapping [b, 5] inputs to [b, 3] logits."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(
            nn.Linear(MLP_IN, 12), nn.LayerNorm(12), nn.Tanh(), nn.Linear(12, 8), nn.GELU(), nn.Linear(8, MLP_CLASSES)
        )
        # non-trivial LayerNorm affine parameters so their curvature is exercised
        with torch.no_grad():
            model[1].weight.normal_(1.0, 0.3)
            model[1].bias.normal_(0.0, 0.3)
    return model.to(dtype).eval()


def mlp_batches(
    n_batches: int = 2,
    batch: int = 16,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    sizes: list[int] | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_batches`` tuples ``(x [b, 5] float, y [b] long)``; ``sizes`` overrides b per batch."""
    g = torch.Generator().manual_seed(seed)
    sizes = sizes if sizes is not None else [batch] * n_batches
    return [
        (torch.randn(b, MLP_IN, generator=g, dtype=dtype), torch.randint(0, MLP_CLASSES, (b,), generator=g))
        for b in sizes
    ]


def mlp_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy (nats, scalar) of ``model`` on ``(x, y)``."""
    x, y = batch
    return F.cross_entropy(model(x), y)


# --- float64 fidelity -------------------------------------------------------------------------
# HF's eager attention takes its softmax in float32 and Llama's RMSNorm normalises in float32, so a
# float64 HF model is only float32-accurate and two exact computations of its Hessian differ at
# ~1e-7. For float64 the micro models below use the same formulas evaluated in float64: attention
# "eager_same_dtype" (HF's eager attention with the softmax in the query's dtype) and an RMSNorm
# without the cast. Pass ``exact64=False`` to keep HF's own code paths.


def _eager_same_dtype(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
):
    n_rep = getattr(module, "num_key_value_groups", 1)
    if n_rep > 1:
        key, value = key.repeat_interleave(n_rep, dim=1), value.repeat_interleave(n_rep, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = F.softmax(weights, dim=-1)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _attn(attn: str, dtype: torch.dtype, exact64: bool) -> str:
    if attn not in ("eager", "sdpa"):
        raise ValueError(f"attn must be 'eager' or 'sdpa', got {attn!r}")
    if attn == "eager" and dtype == torch.float64 and exact64:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, eager_mask

        AttentionInterface.register("eager_same_dtype", _eager_same_dtype)
        AttentionMaskInterface.register("eager_same_dtype", eager_mask)  # the causal mask eager uses
        return "eager_same_dtype"
    return attn


class _RMSNorm64(nn.Module):
    """Llama's RMSNorm without the float32 cast (class swapped onto LlamaRMSNorm instances)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _finish(model: nn.Module, seed: int, dtype: torch.dtype) -> nn.Module:
    # HF initialises with std 0.02, which makes a tiny model's Hessian nearly degenerate;
    # a larger scale gives curvature of every kind (and non-trivial norm weights).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name and name.endswith("weight"):
                    p.normal_(1.0, 0.3)
                elif p.ndim == 1:
                    p.normal_(0.0, 0.2)
                else:
                    p.normal_(0.0, 0.5)
    return model.to(dtype).eval()


def micro_gptneox(
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    attn: str = "eager",
    layers: int = 2,
    dropout: float = 0.0,
    exact64: bool = True,
) -> nn.Module:
    """A 488-parameter HF ``GPTNeoXForCausalLM`` (LayerNorm, GELU, rotary), vocab 17, context 32.

    ``attn`` is ``"eager"`` or ``"sdpa"``; ``dropout`` sets attention and hidden dropout (to check
    that curvature code switches it off); ``exact64`` see the float64 note above.
    """
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=4,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=8,
        max_position_embeddings=CONTEXT,
        rotary_pct=1.0,
        hidden_act="gelu",
        attention_dropout=dropout,
        hidden_dropout=dropout,
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation=_attn(attn, dtype, exact64),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPTNeoXForCausalLM(config)
    return _finish(model, seed, dtype)


def micro_llama(
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    attn: str = "eager",
    layers: int = 2,
    exact64: bool = True,
    act: str = "silu",
) -> nn.Module:
    """A 444-parameter HF ``LlamaForCausalLM`` (RMSNorm, SiLU-gated MLP, GQA 2:1), vocab 17, context 32.

    ``attn`` is ``"eager"`` or ``"sdpa"``; ``exact64`` see the float64 note above; ``act`` the MLP's
    gate activation (HF ``hidden_act``: ``"relu"`` gives a piecewise one).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=4,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=8,
        max_position_embeddings=CONTEXT,
        tie_word_embeddings=False,
        use_cache=False,
        hidden_act=act,
        attn_implementation=_attn(attn, dtype, exact64),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    if dtype == torch.float64 and exact64:
        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                module.__class__ = type("LlamaRMSNorm64", (_RMSNorm64, type(module)), {})
    return _finish(model, seed, dtype)


def random_batches(
    vocab: int = VOCAB, n_batches: int = 2, batch: int = 4, seq: int = 8, seed: int = 0, sizes: list[int] | None = None
) -> list[torch.Tensor]:
    """``n_batches`` uniform random token batches, LongTensors ``[batch, seq]`` (``sizes`` overrides batch)."""
    g = torch.Generator().manual_seed(seed)
    sizes = sizes if sizes is not None else [batch] * n_batches
    return [torch.randint(0, vocab, (b, seq), generator=g) for b in sizes]


def lm_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """:func:`losslens.lm.core.next_token_loss.lm_loss` (mean next-token cross-entropy, nats), kept in float64 for
    float64 models.

    Delegates to ``losslens.lm.core.next_token_loss.lm_loss`` unless that returns a lower precision than the logits (it
    upcasts with ``.float()``, which *down*casts float64 logits to float32 and limits Hessian checks
    to ~1e-7); then the same formula is evaluated in the logits' dtype.
    """
    from losslens.lm.core.next_token_loss import _logits, lm_loss as probe_loss

    dtype = next(model.parameters()).dtype
    if dtype != torch.float64:
        return probe_loss(model, batch)
    ids = batch.to(device=next(model.parameters()).device, dtype=torch.long)
    logits = _logits(model, ids)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


lm_loss.batch_weight = lambda batch: batch.shape[0] * (batch.shape[1] - 1)  # as probes' lm_loss: its targets


def sym_with_spectrum(eigs, seed: int = 0) -> torch.Tensor:
    """A random symmetric float64 matrix ``U diag(eigs) Uᵀ`` with exactly the spectrum ``eigs``
    (U from the QR of a seeded Gaussian matrix)."""
    eigs = torch.as_tensor(eigs, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(len(eigs), len(eigs), generator=g, dtype=torch.float64))
    return (U * eigs) @ U.T


def classifier_mlp_hessian(seed: int = 0):
    """Exact Hessian (float64, [87, 87]) and its ParamSpace of a 4-6-3 tanh MLP's cross-entropy on
    32 random examples: a small dense oracle for the estimator tests (singular, mixed-sign)."""
    from losslens.geometry.operators.dense import exact_hessian

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    g = torch.Generator().manual_seed(seed)
    batch = (torch.randn(32, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (32,), generator=g))
    return exact_hessian(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), [batch])


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
