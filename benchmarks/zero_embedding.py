"""A zero input-embedding row in the curvature batches, and the fix (issue #35).

``python -m benchmarks.zero_embedding [--seeds 0] [--json PATH]``

Models: the six seed families as tiny random-init models (:func:`losslens.lm.models.families.tiny_model`,
hidden 32, 2 layers, vocab 96), float64, with the input-embedding row of the padding token (the
config's ``pad_token_id``, else token 1) set to zero as HF's initialiser does for ``padding_idx``;
two curvature batches of 2 × 16 tokens drawn from the other rows, then the padding token written
into them (the last 4 positions of the first row, right padding, and one position inside the
second batch). Every parameter; loss :func:`losslens.lm.core.next_token_loss.lm_loss`.

Rows, per family and seed (max over 3 seeded Gaussian vectors of ‖Hv − H_ref v‖ / ‖H_ref v‖):

- ``clean``: the batches without the padding token (it is replaced by a drawn token): the
  difference backend against the reverse backend, the error floor of the method;
- ``zero row, plain``: with the padding token, the loss over every token (what the difference
  backend computed before the fix) against the reverse (double backward) products of the same loss;
- ``exact vs pooled``: the reverse backend's products on the plain loss against a double backward
  of the mean over the concatenated per-token losses written here (the exact backends are right);
- ``zero row, fixed``: :func:`losslens.lm.models.curvature.lm_hessian` with the difference backend (the
  padding token left out of the loss as input and target, :mod:`losslens.lm.models.zero_embeddings`)
  against the reverse products of the same loss (:class:`losslens.lm.core.next_token_loss.ExcludingLoss`);
- ``λ_max clean / plain / fixed``: the exact (reverse) Hessian's largest-magnitude eigenvalue
  (Lanczos, ≤ 60 steps) on the clean batches, on the padded ones with every token, and with the
  padding token left out: how much of the exact curvature the zero row itself contributes.

All difference products run under :func:`losslens.lm.models.fidelity.float64_fidelity`.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform

import torch
import torch.nn.functional as F

from losslens.geometry import HessianOperator, top_eigenvalues
from losslens.geometry.operators.attention import second_order_attention
from losslens.geometry.operators.product_check import product_error
from losslens.lm.core.next_token_loss import ExcludingLoss, lm_loss
from losslens.lm.models.curvature import lm_hessian
from losslens.lm.models.families import FAMILIES, tiny_model
from losslens.lm.models.fidelity import float64_fidelity

SEQ, BATCH = 16, 2


def setting(family: str, seed: int) -> tuple[torch.nn.Module, int, list[torch.Tensor], list[torch.Tensor]]:
    """``(model, pad, clean batches, batches with the padding token)``; float64, the pad row zeroed."""
    model = tiny_model(family, seed=seed, dtype=torch.float64)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 1
    with torch.no_grad():
        model.get_input_embeddings().weight[pad] = 0.0
    weight = model.get_input_embeddings().weight
    ids = (weight.abs().sum(1) != 0).nonzero().reshape(-1)
    g = torch.Generator().manual_seed(seed)
    clean = [ids[torch.randint(0, len(ids), (BATCH, SEQ), generator=g)] for _ in range(2)]
    padded = [b.clone() for b in clean]
    padded[0][0, -4:] = pad
    padded[1][1, SEQ // 2] = pad
    return model, pad, clean, padded


def pooled_products(model, batches, V: torch.Tensor) -> torch.Tensor:
    """H V of the mean over the concatenated per-token losses, by a plain double backward."""
    model = copy.deepcopy(model)
    for module in model.modules():  # nn.Embedding zeroes the padding row's gradient: the true derivative keeps it
        if isinstance(module, torch.nn.Embedding):
            module.padding_idx = None
    params = list(model.parameters())
    with float64_fidelity(), second_order_attention():  # SDPA's MATH kernel: it has a double backward
        losses = []
        for b in batches:
            logits = model(input_ids=b).logits
            losses.append(
                F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1), reduction="none")
            )
        g = torch.cat([x.reshape(-1) for x in torch.autograd.grad(torch.cat(losses).mean(), params, create_graph=True)])
        rows = [torch.cat([x.reshape(-1) for x in torch.autograd.grad(g @ v, params, retain_graph=True)]) for v in V]
    return torch.stack(rows).detach()


def measure(family: str, seed: int) -> dict:
    model, pad, clean, padded = setting(family, seed)
    with float64_fidelity():
        row = {
            "family": family,
            "seed": seed,
            "pad": pad,
            "clean": product_error(
                HessianOperator(model, lm_loss, clean, backend="difference"),
                HessianOperator(model, lm_loss, clean),
                3,
                seed,
            ),
            "zero_row_plain": product_error(
                HessianOperator(model, lm_loss, padded, backend="difference"),
                HessianOperator(model, lm_loss, padded),
                3,
                seed,
            ),
        }
        rev = HessianOperator(model, lm_loss, padded)
        V = torch.randn(3, rev.dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        HV = rev.matmat_flat(V)
    want = pooled_products(model, padded, V)
    row["exact_vs_pooled"] = float(((HV - want).norm(dim=1) / want.norm(dim=1)).max())
    fixed = lm_hessian(model, padded, backend="difference")
    with float64_fidelity():
        exact = HessianOperator(model, ExcludingLoss(lm_loss, (pad,)), padded)
        row["zero_row_fixed"] = product_error(fixed, exact, 3, seed)
    row["excluded"] = fixed.excluded
    with float64_fidelity():  # what the exact Hessian's top eigenvalue is with and without the padding token
        for key, loss, batches in (
            ("clean", lm_loss, clean),
            ("plain", lm_loss, padded),
            ("fixed", ExcludingLoss(lm_loss, (pad,)), padded),
        ):
            row[f"lambda_{key}"] = top_eigenvalues(
                HessianOperator(model, loss, batches), k=1, method="lanczos", max_iter=60, tol=1e-8, seed=seed
            ).values[0]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [measure(f, int(s)) for s in args.seeds.split(",") for f in FAMILIES]
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, float64")
    print(
        "| family | seed | clean | zero row, plain | zero row, fixed | exact vs pooled "
        "| excluded positions / targets | λ_max clean | λ_max plain | λ_max fixed |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        e = r["excluded"]
        print(
            f"| {r['family']} | {r['seed']} | {r['clean']:.1e} | {r['zero_row_plain']:.1e} "
            f"| {r['zero_row_fixed']:.1e} | {r['exact_vs_pooled']:.1e} | {e['positions']} / {e['targets']} "
            f"| {r['lambda_clean']:.4g} | {r['lambda_plain']:.4g} | {r['lambda_fixed']:.4g} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
