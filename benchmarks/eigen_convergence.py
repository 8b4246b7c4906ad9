"""λ_max convergence: Lanczos (thick-restarted on the basis the budget allows) against power iteration.

``python -m benchmarks.eigen_convergence [--shapes pythia-14m,pythia-70m] [--max-memory 7GB]
[--methods lanczos,power] [--bases 6] [--max-iter 150] [--tol 1e-3] [--trained] [--threads 2]
[--json PATH]``

Each row: HVPs until the true residual ‖Hv − λv‖ ≤ tol·|λ| (the convergence rule of
:func:`losslens.geometry.estimators.eigen.top_eigenvalues`), or ``max_iter`` unconverged; the value, the
relative residual, the basis the memory plan chose, restarts and seconds. Shapes are the
random-init GPT-NeoX models of :mod:`benchmarks.shapes` (Pythia's published sizes) on its curvature
data (2 batches of 4 × 64 random tokens, the ``--quick`` set of ``losslens sharpness``).
``--trained`` adds a micro GPT-NeoX (tests/tiny_models.py shape) trained here for 300 Adam steps on
a repeating token pattern, so its Hessian is that of a trained model. ``--bases 6`` adds Lanczos rows
with the basis capped at those sizes (``max_basis``), beside the one the planner chose. Threads are pinned for the
run (``--threads``) and restored afterwards.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks import emit


def _row(name: str, op, method: str, tol: float, max_iter: int, max_memory, max_basis: int | None = None) -> dict:
    from losslens.geometry.estimators.eigen import top_eigenvalues

    t0 = time.perf_counter()
    res = top_eigenvalues(
        op,
        k=1,
        method=method,
        tol=tol,
        max_iter=max_iter,
        max_memory=max_memory,
        max_basis=max_basis if method == "lanczos" else None,
    )
    st = res.memory.get("settings", {})
    return {
        "model": name,
        "dim": op.dim,
        "method": method,
        "max_memory": max_memory,
        "tol": tol,
        "lambda_max": res.values[0],
        "converged": res.converged[0],
        "num_matvecs": res.num_matvecs,
        "relative_residual": res.residuals[0] / abs(res.values[0]),
        "basis_size": st.get("basis_size"),
        "cache_graphs": st.get("cache_graphs"),
        "restarts": res.memory.get("restarts"),
        "predicted_GB": res.memory["predicted_bytes"] / 1e9,
        "seconds": time.perf_counter() - t0,
    }


def _variants(methods, bases) -> list[tuple[str, int | None]]:
    """(method, max_basis) rows: Lanczos with the planner's basis, then capped, then power."""
    rows = [("lanczos", None)] * ("lanczos" in methods) + [("lanczos", b) for b in bases]
    return rows + [(m, None) for m in methods if m != "lanczos"]


def _trained_micro(steps: int = 300, seed: int = 0):
    """A micro GPT-NeoX trained on a repeating pattern (loss well below ln(vocab)), and its data."""
    from tests.tiny_models import VOCAB, lm_loss, micro_gptneox

    model = micro_gptneox(seed=seed, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    pattern = torch.randint(0, VOCAB, (17,), generator=g)

    def batch():
        starts = torch.randint(0, 17, (8,), generator=g)
        return torch.stack([pattern[(s + torch.arange(32)) % 17] for s in starts])

    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        opt.zero_grad()
        loss = lm_loss(model, batch())
        loss.backward()
        opt.step()
    model.eval()
    return model, [batch() for _ in range(2)], float(loss.detach())


def run(
    shapes=("pythia-14m", "pythia-70m"),
    max_memory: str | None = "7GB",
    methods=("lanczos", "power"),
    max_iter: int = 150,
    tol: float = 1e-3,
    trained: bool = True,
    threads: int | None = 2,
    bases: tuple[int, ...] = (6,),
) -> list[dict]:
    from benchmarks.shapes import BATCH, BATCHES, SEQ, SHAPES, build
    from losslens.lm.models.curvature import lm_hessian

    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    rows = []
    try:
        if trained:
            from losslens.geometry.operators.hessian import HessianOperator
            from tests.tiny_models import lm_loss

            model, batches, loss = _trained_micro()
            for method, basis in _variants(methods, bases):
                op = HessianOperator(model, lm_loss, batches)
                rows.append(
                    {**_row("micro-gptneox trained", op, method, tol, max_iter, max_memory, basis), "train_loss": loss}
                )
                emit(rows[-1:])
        for shape in shapes:
            model = build(shape, torch.float32)
            g = torch.Generator().manual_seed(0)
            batches = [torch.randint(0, SHAPES[shape][4], (BATCH, SEQ), generator=g) for _ in range(BATCHES)]
            for method, basis in _variants(methods, bases):
                op = lm_hessian(model, batches, max_memory=max_memory)
                rows.append(_row(shape, op, method, tol, max_iter, max_memory, basis))
                emit(rows[-1:])
            del model, batches, op
    finally:
        torch.set_num_threads(old)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="pythia-14m,pythia-70m")
    p.add_argument("--max-memory", default="7GB")
    p.add_argument("--methods", default="lanczos,power")
    p.add_argument("--max-iter", type=int, default=150)
    p.add_argument("--tol", type=float, default=1e-3)
    p.add_argument("--trained", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bases", default="6", help="Lanczos rows with the basis capped at these sizes (beside --methods)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    shapes = tuple(s for s in a.shapes.split(",") if s)
    rows = run(
        shapes,
        a.max_memory,
        tuple(a.methods.split(",")),
        a.max_iter,
        a.tol,
        a.trained,
        a.threads,
        tuple(int(b) for b in a.bases.split(",") if b),
    )
    if a.json:
        import json

        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2, default=str)
    return rows


if __name__ == "__main__":
    main()
