"""Write small GGUF checkpoints with the ``gguf`` package's writer (llama.cpp's layout), for the tests.

transformers' GGUF loader does not read GPT-NeoX (the tiny trainer's family), so the model is a tiny
**llama** (RMSNorm, SwiGLU, GQA) trained here for a few AdamW steps on the embedded corpus with a
byte-level BPE tokenizer (train_bpe_tokenizer) that is written into the file as a ``gpt2``
tokenizer (tokens, types, merges). Tensors use llama.cpp's names and its q/k row permutation
(convert_hf_to_gguf's ``permute``); the block linears are stored as Q8_0 (or another type), the
rest as F32.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

HIDDEN, LAYERS, HEADS, KV_HEADS, INTER = 64, 2, 4, 2, 128


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF (rotate-half) → GGML (interleaved) row order of a q/k projection."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_names() -> dict[str, str]:
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    for i in range(LAYERS):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        names.update(
            {
                p + "input_layernorm.weight": b + "attn_norm.weight",
                p + "self_attn.q_proj.weight": b + "attn_q.weight",
                p + "self_attn.k_proj.weight": b + "attn_k.weight",
                p + "self_attn.v_proj.weight": b + "attn_v.weight",
                p + "self_attn.o_proj.weight": b + "attn_output.weight",
                p + "post_attention_layernorm.weight": b + "ffn_norm.weight",
                p + "mlp.gate_proj.weight": b + "ffn_gate.weight",
                p + "mlp.up_proj.weight": b + "ffn_up.weight",
                p + "mlp.down_proj.weight": b + "ffn_down.weight",
            }
        )
    return names


def train_tiny_llama(steps: int = 20):
    """(model, tokenizer): a tiny LlamaForCausalLM trained ``steps`` AdamW steps on embedded text."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from losslens.lm.core.next_token_loss import lm_loss
    from losslens.lm.data.corpus import embedded_corpus
    from losslens.lm.data.tokenizers import train_bpe_tokenizer

    text = embedded_corpus()[:200_000]
    tok = train_bpe_tokenizer(text, vocab_size=320)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    ids = torch.tensor(tok.encode(text[:40_000])[: 16 * 64]).reshape(16, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = lm_loss(model, ids)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), tok


def write_gguf(path: Path, model, tok, linear_type: str = "Q8_0") -> Path:
    """Write ``model`` + ``tok`` as a llama GGUF file; block linears in ``linear_type`` (or "F32")."""
    import gguf
    from gguf import GGMLQuantizationType as T

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(path.stem)
    w.add_context_length(128)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tok))
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(
        [gguf.TokenType.CONTROL if t in tok.all_special_tokens else gguf.TokenType.NORMAL for t in tokens]
    )
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    for key, name in gguf_names().items():
        a = sd[key]
        if key.endswith("q_proj.weight"):
            a = permute(a, HEADS)
        elif key.endswith("k_proj.weight"):
            a = permute(a, KV_HEADS)
        if a.ndim == 2 and ".layers." in key and linear_type != "F32":
            qt = getattr(T, linear_type)
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)
        else:
            w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
