"""The models of the HVP benchmarks: randomly initialised HF GPT-NeoX (LayerNorm, GELU) and Llama
(RMSNorm, SiLU) causal LMs, float32, eager attention, in two sizes (:data:`SIZES`: ~1M parameters,
hidden 128, 4 layers, vocab 512; ~9M, hidden 256, 6 layers, vocab 8192), and the default batch
shape (:data:`BATCH` sequences × :data:`SEQ` tokens). Used by :mod:`benchmarks.hvp_throughput`,
:mod:`benchmarks.solvers` and :mod:`benchmarks.data_parallel`.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SIZES", "BATCH", "SEQ", "build_model"]

SIZES = {"1M": dict(hidden=128, layers=4, vocab=512), "10M": dict(hidden=256, layers=6, vocab=8192)}
BATCH, SEQ = 8, 128


def build_model(arch: str, size: str, seed: int = 0) -> nn.Module:
    """Random HF causal LM (float32, eager attention, eval mode)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

    h, L, V = SIZES[size]["hidden"], SIZES[size]["layers"], SIZES[size]["vocab"]
    torch.manual_seed(seed)
    if arch == "neox":
        cfg = GPTNeoXConfig(
            vocab_size=V,
            hidden_size=h,
            num_hidden_layers=L,
            num_attention_heads=4,
            intermediate_size=4 * h,
            max_position_embeddings=SEQ,
            tie_word_embeddings=False,
            use_cache=False,
            attn_implementation="eager",
        )
        model = GPTNeoXForCausalLM(cfg)
    else:
        cfg = LlamaConfig(
            vocab_size=V,
            hidden_size=h,
            num_hidden_layers=L,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=(8 * h // 3) // 8 * 8,
            max_position_embeddings=SEQ,
            tie_word_embeddings=False,
            use_cache=False,
            attn_implementation="eager",
        )
        model = LlamaForCausalLM(cfg)
    return model.eval()
