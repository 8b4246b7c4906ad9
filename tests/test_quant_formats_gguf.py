"""llama.cpp's GGUF types bit for bit against the ``gguf`` package (skipped only without it).

* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (every type our specs offer that ``gguf.quants`` can *quantize*):
  ``gguf.quants.quantize`` → ``dequantize`` must equal :func:`losslens.lm.quant.ggml.gguf_quantize` in
  every bit, on 3 seeds of random rows (with zero, constant and tie rows) and on a trained tiny
  model's weights.
* Q4_K (``gguf`` only dequantizes it): a scalar transcription of ``quantize_row_q4_K_ref``
  (tests/ggml_transcription.py) writes real 144-byte blocks, ``gguf``'s dequantizer decodes them,
  and that must equal our vectorised Q4_K in every bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType

from losslens.lm.quant import QuantizeError, quantize  # noqa: E402 - after the gguf skip
from losslens.lm.quant.formats import GGUF_TYPES  # noqa: E402 - after the gguf skip
from losslens.lm.quant.ggml import TYPES, gguf_quantize  # noqa: E402 - after the gguf skip
from tests.ggml_transcription import quantize_row_q4_k  # noqa: E402 - after the gguf skip

LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
SEEDS = (0, 1, 2)


def random_rows(seed: int, cols: int = 256) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(24, cols, generator=g) * torch.exp(2 * torch.randn(24, 1, generator=g))
    x[0, :32] = 0  # all-zero block
    x[1, :32] = 0.3  # constant block
    x[2, :32] = torch.tensor([1.0, -1.0] * 16)  # |max| tie between signs: the first wins
    x[3, :32] = torch.linspace(-8, 8, 32)  # values on and between grid points
    x[4] *= 1e-4
    return x


@pytest.fixture(scope="module")
def trained_weights():
    """The weights of every linear of a tiny GPT-NeoX trained 40 AdamW steps on a token chain."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from losslens.lm.core.next_token_loss import lm_loss

    cfg = GPTNeoXConfig(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=32,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)
    ids = (torch.arange(32)[None, :] * 7 + torch.randint(0, 64, (8, 1), generator=g)) % 64
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(40):
        loss = lm_loss(model, ids)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def gguf_roundtrip(x: torch.Tensor, name: str) -> np.ndarray:
    qt = getattr(T, name)
    return gguf.quants.dequantize(gguf.quants.quantize(x.numpy(), qt), qt)


def same_bits(a: np.ndarray, b: torch.Tensor) -> bool:
    return np.array_equal(np.ascontiguousarray(a, dtype=np.float32).view(np.uint32), b.numpy().view(np.uint32))


def test_type_tables_agree():
    assert {k: (v[0], v[1]) for k, v in TYPES.items()} == GGUF_TYPES


@pytest.mark.parametrize("name", LEGACY)
@pytest.mark.parametrize("seed", SEEDS)
def test_legacy_types_bit_exact_on_random_rows(name, seed):
    x = random_rows(seed)
    ours, notes = gguf_quantize(x, name)
    assert same_bits(gguf_roundtrip(x, name), ours) and notes == ()


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_types_bit_exact_on_trained_weights(name, trained_weights):
    for w in trained_weights.values():
        assert same_bits(gguf_roundtrip(w, name), gguf_quantize(w, name)[0])


def q4_k_reference(x: torch.Tensor) -> np.ndarray:
    raw = b"".join(quantize_row_q4_k(r) for r in x.numpy())
    return gguf.quants.dequantize(np.frombuffer(raw, dtype=np.uint8).reshape(x.shape[0], -1), T.Q4_K)


@pytest.mark.parametrize("seed", SEEDS)
def test_q4_k_bit_exact_on_random_rows(seed):
    x = random_rows(seed)[:6]
    assert same_bits(q4_k_reference(x), gguf_quantize(x, "Q4_K")[0])


def test_q4_k_bit_exact_on_trained_weights(trained_weights):
    W = trained_weights["gpt_neox.layers.1.mlp.dense_4h_to_h"]  # [64, 256]: real Q4_K rows
    rows = W[::8]
    assert same_bits(q4_k_reference(rows), gguf_quantize(rows, "Q4_K")[0])
    qkv = trained_weights["gpt_neox.layers.0.attention.query_key_value"].reshape(-1, 256)[::16]
    assert same_bits(q4_k_reference(qkv), gguf_quantize(qkv, "Q4_K")[0])


def test_fallback_and_refusal():
    w = random_rows(0, cols=96)
    out, notes = gguf_quantize(w, "Q4_K")  # 96 % 256 != 0 but 96 % 32 == 0: llama-quantize uses Q5_0
    assert torch.equal(out, gguf_quantize(w, "Q5_0")[0]) and "Q5_0" in notes[0]
    with pytest.raises(QuantizeError, match="blocks of 32"):
        gguf_quantize(random_rows(0, cols=48), "Q8_0")
    lin = torch.nn.Sequential(torch.nn.Linear(40, 8))
    with pytest.raises(QuantizeError, match="in_features = 40"):
        quantize(lin, "gguf:Q4_0", modules="0")


def test_float64_and_bf16_weights_go_through_float32():
    x = random_rows(1)
    ref = gguf_quantize(x, "Q4_1")[0]
    assert torch.equal(gguf_quantize(x.double(), "Q4_1")[0], ref.double())
    assert gguf_quantize(x.bfloat16(), "Q4_1")[0].dtype == torch.bfloat16
