"""The model shapes of the scale benchmarks: Pythia's, OLMo-2's and Llama's published sizes, built
random-init (:func:`build`), and the curvature data every probe of ``benchmarks.scale`` uses."""

from __future__ import annotations

import torch

#: name -> (hidden, layers, heads, intermediate, vocab); published configs (EleutherAI/pythia-*,
#: allenai/OLMo-2-0425-1B, allenai/OLMo-2-1124-7B).
SHAPES = {
    "pythia-14m": (128, 6, 4, 512, 50304),
    "pythia-70m": (512, 6, 8, 2048, 50304),
    "pythia-160m": (768, 12, 12, 3072, 50304),
    "pythia-410m": (1024, 24, 16, 4096, 50304),
    "pythia-1b": (2048, 16, 8, 8192, 50304),
    "olmo-2-1b": (2048, 16, 16, 8192, 100352),
    "pythia-6.9b": (4096, 32, 32, 16384, 50432),
    "olmo-2-7b": (4096, 32, 32, 11008, 100352),
    # small shapes of each family for the pass factors (--factors): hidden × layers, Pythia's vocabulary
    "pythia-128x6": (128, 6, 4, 512, 50304),
    "pythia-512x2": (512, 2, 8, 2048, 50304),
    "olmo-2-128x6": (128, 6, 4, 512, 50304),
    "olmo-2-512x2": (512, 2, 8, 2048, 50304),
    "llama-128x6": (128, 6, 4, 512, 50304),
    "llama-512x2": (512, 2, 8, 2048, 50304),
}
#: curvature data of every probe: BATCHES batches of BATCH × SEQ random tokens
BATCHES, BATCH, SEQ = 2, 4, 64


def build(shape: str, dtype: torch.dtype, layers: int | None = None, seed: int = 0) -> torch.nn.Module:
    """Random-init model with the shape's sizes (GPT-NeoX for pythia-*, OLMo-2 for olmo-2-*)."""
    import transformers

    h, L, heads, ff, vocab = SHAPES[shape]
    L = layers or L
    torch.manual_seed(seed)
    if shape.startswith("llama"):
        cfg = transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=h,
            num_hidden_layers=L,
            num_attention_heads=heads,
            intermediate_size=ff,
            max_position_embeddings=4096,
            use_cache=False,
            tie_word_embeddings=False,
        )
        cls = transformers.LlamaForCausalLM
    elif shape.startswith("olmo"):
        cfg = transformers.Olmo2Config(
            vocab_size=vocab,
            hidden_size=h,
            num_hidden_layers=L,
            num_attention_heads=heads,
            intermediate_size=ff,
            max_position_embeddings=4096,
            use_cache=False,
        )
        cls = transformers.Olmo2ForCausalLM
    else:
        cfg = transformers.GPTNeoXConfig(
            vocab_size=vocab,
            hidden_size=h,
            num_hidden_layers=L,
            num_attention_heads=heads,
            intermediate_size=ff,
            rotary_pct=0.25,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            use_cache=False,
        )
        cls = transformers.GPTNeoXForCausalLM
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype if dtype.is_floating_point and dtype != torch.float16 else old)
    try:  # built in its dtype: no float32 copy first
        return cls(cfg).to(dtype).eval()
    finally:
        torch.set_default_dtype(old)
