"""The seed studies' model families as tiny random-init models.

The studies losslens serves quantized checkpoints of six architectures. :data:`FAMILIES` holds a
tiny, CPU-friendly configuration of each, built from its own ``transformers`` config class (no
download, random init), so every probe can be tested on every family:

===========  ======================  ==========================================================
family       transformers classes    what is architecture-specific (seed checkpoints)
===========  ======================  ==========================================================
gpt_neox     GPTNeoXConfig /         LayerNorm with bias, parallel residual, fused QKV linear,
             GPTNeoXForCausalLM      partial rotary (25%), GELU MLP (Pythia)
olmo         OlmoConfig /            non-parametric LayerNorm (no weight/bias), q/k/v clamped to
             OlmoForCausalLM         ±clip_qkv (OLMo-7B-0424), SwiGLU (OLMo 1)
olmo2        Olmo2Config /           RMSNorm *after* attention/MLP (post-norm residual), QK-norm
             Olmo2ForCausalLM        over the full q/k projections (OLMo 2)
smollm3      SmolLM3Config /         GQA, NoPE layers (every ``no_rope_layer_interval``-th layer has
             SmolLM3ForCausalLM      no rotary embedding), tied embeddings (SmolLM3)
apertus      ApertusConfig /         xIELU activation (trainable α_p, α_n), non-gated MLP,
             ApertusForCausalLM      per-head QK-RMSNorm, llama3 RoPE scaling (Apertus)
llama        LlamaConfig /           RMSNorm, SwiGLU, GQA (Amber, LLM360)
             LlamaForCausalLM
===========  ======================  ==========================================================

:func:`tiny_model` builds one (hidden 32, 2 layers, vocab 96 by default; a few thousand
parameters, milliseconds per forward). Weights come from the model's own initialiser with a
larger ``initializer_range`` (0.2 instead of 0.02) so that a random model has non-degenerate
curvature and visible quantization error.

The second-order AD check every family is tested with lives in :mod:`losslens.lm.models.second_order`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

__all__ = ["FAMILIES", "Family", "tiny_model", "family_of"]

VOCAB = 96
HIDDEN = 32
LAYERS = 2
HEADS = 2
CONTEXT = 64
INIT_RANGE = 0.2


@dataclass(frozen=True)
class Family:
    """One model family: its transformers classes, a tiny config and the checkpoints it stands for.

    Attributes:
        name: short key (``"gpt_neox"``, ``"olmo"``, ...).
        config_class, model_class: class names in ``transformers``.
        config: keyword arguments of the tiny config (besides the shared sizes).
        seeds: hub repositories of the studies' real checkpoints (documentation only; never downloaded).
        notes: what is architecture-specific.
    """

    name: str
    config_class: str
    model_class: str
    config: Mapping[str, Any]
    seeds: tuple[str, ...] = ()
    notes: str = ""

    def config_object(self, **overrides):
        """The tiny ``transformers`` config (shared sizes + family kwargs + ``overrides``)."""
        import transformers

        kw: dict[str, Any] = dict(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=2 * HIDDEN,
            max_position_embeddings=CONTEXT,
            initializer_range=INIT_RANGE,
            use_cache=False,
        )
        kw.update(self.config)
        kw.update(overrides)
        return getattr(transformers, self.config_class)(**kw)


_SPECIAL = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)

FAMILIES: dict[str, Family] = {
    "gpt_neox": Family(
        "gpt_neox",
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(
            rotary_pct=0.25,
            hidden_act="gelu",
            use_parallel_residual=True,
            tie_word_embeddings=False,
            bos_token_id=0,
            eos_token_id=2,
        ),
        ("EleutherAI/pythia-160m",),
        "LayerNorm, parallel residual, fused query_key_value, partial rotary",
    ),
    "olmo": Family(
        "olmo",
        "OlmoConfig",
        "OlmoForCausalLM",
        dict(clip_qkv=8.0, **_SPECIAL),
        ("allenai/OLMo-1B-hf", "allenai/OLMo-7B-0424-hf"),
        "non-parametric LayerNorm, clip_qkv clamp, SwiGLU",
    ),
    "olmo2": Family(
        "olmo2",
        "Olmo2Config",
        "Olmo2ForCausalLM",
        dict(**_SPECIAL),
        ("allenai/OLMo-2-0425-1B",),
        "post-norm RMSNorm, QK-norm over full projections",
    ),
    "smollm3": Family(
        "smollm3",
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        dict(num_key_value_heads=1, no_rope_layer_interval=2, tie_word_embeddings=True, **_SPECIAL),
        ("HuggingFaceTB/SmolLM3-3B",),
        "GQA, NoPE every 2nd layer, tied embeddings",
    ),
    "apertus": Family(
        "apertus",
        "ApertusConfig",
        "ApertusForCausalLM",
        dict(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 12000000.0,
                "factor": 8.0,
                "original_max_position_embeddings": 32,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
            },
            **_SPECIAL,
        ),
        ("swiss-ai/Apertus-8B-2509",),
        "xIELU activation, QK-RMSNorm, llama3 RoPE",
    ),
    "llama": Family(
        "llama",
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(num_key_value_heads=1, tie_word_embeddings=False),
        ("LLM360/Amber",),
        "RMSNorm, SwiGLU, GQA",
    ),
}
"""The seed families, by name (see the module docstring)."""


def tiny_model(
    family: str, seed: int = 0, dtype: torch.dtype = torch.float32, attn: str = "sdpa", **config_overrides
) -> nn.Module:
    """A tiny random-init causal LM of ``family`` (a key of :data:`FAMILIES`), in eval mode.

    Args:
        family: ``"gpt_neox"``, ``"olmo"``, ``"olmo2"``, ``"smollm3"``, ``"apertus"`` or ``"llama"``.
        seed: seed of the initialisation (the global RNG is left untouched).
        dtype: parameter dtype (float64 for exact curvature checks).
        attn: ``attn_implementation`` (``"sdpa"``, HF's default, or ``"eager"``).
        config_overrides: any config field (``hidden_size=16``, ``num_hidden_layers=1``, ...).

    Returns the ``*ForCausalLM`` model (default sizes: hidden 32, 2 layers, 2 heads, MLP 64,
    vocab 96, context 64; 6–9k parameters).
    """
    import transformers

    if family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    fam = FAMILIES[family]
    config = fam.config_object(attn_implementation=attn, **config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = getattr(transformers, fam.model_class)(config)
    return model.to(dtype).eval()


def family_of(model: nn.Module) -> str | None:
    """The :data:`FAMILIES` key of a model (by its config's ``model_type``), or None."""
    mt = getattr(getattr(model, "config", None), "model_type", None)
    return mt if mt in FAMILIES else None
