"""Compute precision of half-precision checkpoints (issue #35): default float32 compute against float64.

``python -m benchmarks.precision [--seeds 3]``

For tiny random-init bfloat16 models of the six seed families (:data:`losslens.lm.models.families.FAMILIES`)
and four others (Qwen2, Mistral, Gemma, Phi-3 configs of the same sizes), two 2 × 16 batches of tokens
whose input-embedding row is not zero: the relative error ‖H̃V − HV‖/‖HV‖ over two Gaussian vectors of
the default operators (float32 compute: reverse, difference, difference with Richardson) and of the
explicit bfloat16 compute (reverse, difference), against the float64 reverse products of the same
bfloat16 weights (HF's float32 islands in float64). One thread; errors only (no timings).
"""

from __future__ import annotations

import argparse
import copy
import json
import warnings

import torch

from losslens.geometry import HessianOperator
from losslens.geometry.operators.difference import DifferenceBackend
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.models.families import FAMILIES, tiny_model
from losslens.lm.models.fidelity import float64_fidelity

OTHERS = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=1)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=1)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16, num_key_value_heads=1, pad_token_id=1)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)),
}


def bf16_model(family: str, seed: int) -> torch.nn.Module:
    """A tiny random-init bfloat16 causal LM (hidden 32, 2 layers, vocabulary 96)."""
    if family in FAMILIES:
        return tiny_model(family, seed=seed, dtype=torch.bfloat16)
    import transformers

    cfg_name, cls_name, extra = OTHERS[family]
    config = getattr(transformers, cfg_name)(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        use_cache=False,
        attn_implementation="sdpa",
        **extra,
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        return getattr(transformers, cls_name)(config).to(torch.bfloat16).eval()


def batches_of(model, seed: int) -> list[torch.Tensor]:
    weight = model.get_input_embeddings().weight
    ids = (weight.abs().sum(1) != 0).nonzero().reshape(-1)
    g = torch.Generator().manual_seed(200 + seed)
    return [ids[torch.randint(0, len(ids), (2, 16), generator=g)] for _ in range(2)]


def row(family: str, seed: int) -> dict:
    model = bf16_model(family, seed)
    batches = batches_of(model, seed)
    with float64_fidelity():
        exact = HessianOperator(copy.deepcopy(model).double(), lm_loss, batches)
        V = torch.randn(2, exact.dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        ref = exact.matmat_flat(V)

    def err(**kw) -> float:
        got = HessianOperator(model, lm_loss, batches, **kw).matmat_flat(V.float()).double()
        return float((got - ref).norm() / ref.norm())

    return {
        "family": family,
        "seed": seed,
        "reverse_f32": err(),
        "difference_f32": err(backend="difference"),
        "richardson_f32": err(backend=DifferenceBackend(richardson=True)),
        "reverse_bf16": err(compute_dtype="bfloat16"),
        "difference_bf16": err(backend="difference", compute_dtype="bfloat16"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for family in list(FAMILIES) + list(OTHERS):
        for seed in range(args.seeds):
            print(json.dumps(row(family, seed)), flush=True)


if __name__ == "__main__":
    main()
