"""Loss-surface throughput: losslens grid evaluation vs plain forward passes and vs `loss-landscapes`.

    python -m benchmarks.surface [--quick] [--json out.json]

Model: a 1.06M-parameter HF GPT-NeoX (hidden 128, 4 layers, 4 heads, MLP 512, vocab 1024 -- the
shape of the embedded tiny model, docs/science.md §8), random weights, float32, CPU. Data: 4 evaluation
batches of 4×64 tokens (``losslens.lm.data.QUICK_SHAPES["eval"]``), identical for every contender.
The plane: A = the model, B = A + a small perturbation (a "previous checkpoint"), C = A rounded
per row to 16 levels (an RTN-like "quantized A").

Rows (one "point" = the loss over all 4 batches at one set of weights):
- ``forward``: ``losslens.lm.core.next_token_loss.evaluate`` on the unchanged model, points/s -- the plain-forward
ceiling.
- ``losslens``: ``evaluate_surface`` batch by batch (``merge_batches=False``), in-place moves.
- ``losslens-merged``: ``evaluate_surface(merge_batches=True)`` (one forward per point; what
  ``losslens surface`` uses).
- ``loss-landscapes``: ``loss_landscapes.planar_interpolation`` (v3.0.6) over the same three models
  with a Metric evaluating the same batches, ``deepcopy_model=True``.
- ``grid31``: the full 31×31 grid (+3 marked points) with ``merge_batches=True`` (full mode only;
  goal ≤ 120 s on 2 cores).
``ratio_vs_forward`` = points/s ÷ forward points/s (goal ≥ 0.8); ``ratio_vs_loss_landscapes`` =
points/s ÷ loss-landscapes points/s (goal ≥ 10). Timings on a shared machine are noisy: each
contender is measured ``repeats`` times, interleaved, and the best is reported.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from losslens.lm.core.threads import torch_threads

N_BATCHES, BATCH, SEQ = 4, 4, 64


def _model(seed: int = 0):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=1024,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        use_cache=False,
    )
    torch.manual_seed(seed)
    return GPTNeoXForCausalLM(cfg).eval()


def _points(model):
    A = {n: p.detach().clone() for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(1)
    B = {n: v + 0.01 * torch.randn(v.shape, generator=g) for n, v in A.items()}
    C = {}
    for n, v in A.items():
        if v.ndim == 2:
            lo, hi = v.min(dim=1, keepdim=True).values, v.max(dim=1, keepdim=True).values
            scale = (hi - lo).clamp_min(1e-8) / 15
            C[n] = torch.round((v - lo) / scale) * scale + lo
        else:
            C[n] = v.clone()
    return A, B, C


def _with(model, weights):
    m = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(weights[n])
    return m


def run(quick: bool = False, repeats: int | None = None) -> list[dict]:
    from losslens.geometry.surfaces.grid import GridSpec
    from losslens.geometry.surfaces.point_planes import plane_through_points
    from losslens.geometry.surfaces.surface import evaluate_surface
    from losslens.lm.core.next_token_loss import evaluate, lm_loss

    repeats = repeats or (2 if quick else 3)
    steps = 3 if quick else 6  # grid side for the throughput comparison
    model = _model()
    n_params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 1024, (BATCH, SEQ), generator=g) for _ in range(N_BATCHES)]
    A, B, C = _points(model)
    plane = plane_through_points(A, B, C)
    mB, mC = _with(model, B), _with(model, C)

    try:
        import loss_landscapes
        from loss_landscapes.metrics import Metric

        class LMLoss(Metric):  # the same loss over the same batches, as a loss-landscapes Metric
            def __call__(self, wrapper):
                with torch.no_grad():
                    return sum(float(lm_loss(wrapper.modules[0], b)) for b in batches) / len(batches)

        ll_version = getattr(loss_landscapes, "__version__", "3.0.6")
    except ImportError:  # pragma: no cover - peer not installed
        loss_landscapes = None

    def t_forward():
        n = steps * steps
        t0 = time.perf_counter()
        for _ in range(n):
            evaluate(model, batches)
        return n / (time.perf_counter() - t0)

    def t_losslens(merge):
        s = evaluate_surface(model, lm_loss, batches, plane, GridSpec(resolution=steps), merge_batches=merge)
        return s.meta["points_evaluated"] / s.seconds

    def t_ll():
        t0 = time.perf_counter()
        loss_landscapes.planar_interpolation(model, mB, mC, LMLoss(), steps=steps, deepcopy_model=True)
        return steps * steps / (time.perf_counter() - t0)

    contenders = {
        "forward": t_forward,
        "losslens": lambda: t_losslens(False),
        "losslens-merged": lambda: t_losslens(True),
    }
    if loss_landscapes is not None:
        contenders["loss-landscapes"] = t_ll
    best: dict[str, float] = {k: 0.0 for k in contenders}
    evaluate(model, batches)  # warm-up
    for _ in range(repeats):
        for name, fn in contenders.items():
            best[name] = max(best[name], fn())
    rows = []
    for name, pps in best.items():
        row = {
            "benchmark": "surface",
            "contender": name,
            "points_per_s": pps,
            "ratio_vs_forward": pps / best["forward"],
            "grid": f"{steps}x{steps}",
            "data": f"{N_BATCHES}x[{BATCH},{SEQ}]",
            "params": n_params,
            "threads": torch.get_num_threads(),
        }
        if "loss-landscapes" in best:
            row["ratio_vs_loss_landscapes"] = pps / best["loss-landscapes"]
        if name == "loss-landscapes":
            row["peer_version"] = ll_version
        rows.append(row)
    if not quick:
        s = evaluate_surface(model, lm_loss, batches, plane, GridSpec(resolution=31), merge_batches=True)
        rows.append(
            {
                "benchmark": "surface",
                "contender": "grid31",
                "points_per_s": s.meta["points_evaluated"] / s.seconds,
                "seconds": s.seconds,
                "goal_seconds": 120.0,
                "met": s.seconds <= 120.0,
                "grid": "31x31",
                "data": f"{N_BATCHES}x[{BATCH},{SEQ}]",
                "params": n_params,
                "threads": torch.get_num_threads(),
            }
        )
    # the model was restored exactly by every losslens call
    assert all(torch.equal(p, A[n]) for n, p in model.named_parameters())
    return rows


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="3×3 grids, 2 repeats, no 31×31 grid (< 60 s on an idle 2-core machine)"
    )
    ap.add_argument("--json", help="write the rows to this JSON file")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (0: torch's default); 1 gives the most stable ratios"
    )
    args = ap.parse_args(argv)
    with torch_threads(args.threads):
        rows = run(quick=args.quick)
    for r in rows:
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
