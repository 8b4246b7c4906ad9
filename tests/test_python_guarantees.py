"""The same guarantees at every level (issue #45, item 3): a curvature operator built from Python gets
what ``losslens sharpness`` gets, or says why not.

- The documented Python path for a language model, :func:`losslens.lm.models.lm_hessian`, on each of the six
  seed families in float64 and float32, with a zero-embedding (padding) token in the batches and the
  difference backend: its products agree with a plain double backward of the kept-token loss written
  here (``torch.autograd.grad`` twice, the padding's inputs masked and its targets dropped by hand) to
  1e-6 (float64) / 1e-3 (float32), or a :class:`LosslensWarning` was raised.
- The low level (:class:`HessianOperator`, any loss): a measured product error over the tolerance is a
  :class:`ProductErrorWarning` (filterable, an exception under ``simplefilter("error")``), emitted once
  per operator, measured before the first product leaves; exact backends emit none; a raw operator whose
  loss counts zero-embedding tokens emits a :class:`ZeroEmbeddingWarning` naming them.
"""

from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import losslens.geometry as geometry
from losslens.geometry import HessianOperator, LosslensWarning, ProductErrorWarning, ZeroEmbeddingWarning
from losslens.geometry.estimators.trace import hutchinson_trace
from losslens.geometry.memory.budget import MemoryBudgetError
from losslens.geometry.operators.difference import DifferenceBackend
from losslens.lm.core.next_token_loss import ExcludingLoss, lm_loss
from losslens.lm.models.curvature import ERROR_TOLERANCE, lm_hessian
from losslens.lm.models.families import FAMILIES, tiny_model
from losslens.lm.models.fidelity import float64_fidelity
from losslens.lm.models.lm_setup import plan_lm_setup

SEQ = 10
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3}


def _setting(family: str, dtype: torch.dtype, seed: int = 0):
    """A tiny ``family`` model in ``dtype`` with its padding row zeroed, and two [2, SEQ] batches holding
    the padding token (right padding of 3 in row 0 of the first, one position inside the second)."""
    model = tiny_model(family, seed=seed, dtype=dtype, hidden_size=16, intermediate_size=32)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 1
    with torch.no_grad():
        model.get_input_embeddings().weight[pad] = 0.0
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(3, 96, (2, SEQ), generator=g) for _ in range(2)]
    batches[0][0, -3:] = pad
    batches[1][1, SEQ // 2] = pad
    return model, pad, batches


def _kept_token_hvps(model, names, batches, pad, V) -> torch.Tensor:
    """H v for each row of ``V`` [k, dim] (flat in the order of ``names``), H the Hessian of the mean
    cross-entropy over the kept targets (a target counts when it and its input are not ``pad``; the pad
    positions are hidden by the attention mask), by two ``torch.autograd.grad`` calls. A float64 model's
    HF float32 casts are kept in float64 (``float64_fidelity``), so the reference is float64-exact."""
    params = dict(model.named_parameters())
    ps = [params[n] for n in names]
    fidelity = float64_fidelity() if ps[0].dtype == torch.float64 else contextlib.nullcontext()
    with fidelity, sdpa_kernel(SDPBackend.MATH):
        total, count = 0.0, 0
        for b in batches:
            keep = b != pad
            logits = model(input_ids=b, attention_mask=keep.long()).logits
            valid = (keep[:, :-1] & keep[:, 1:]).reshape(-1)
            flat = logits[:, :-1].reshape(-1, logits.shape[-1])
            total = total + F.cross_entropy(flat[valid], b[:, 1:].reshape(-1)[valid], reduction="sum")
            count += int(valid.sum())
        grads = torch.autograd.grad(total / count, ps, create_graph=True)
        rows = []
        for v in V.to(ps[0].dtype):
            parts = torch.split(v, [p.numel() for p in ps])
            dot = sum((g * u.view_as(p)).sum() for g, u, p in zip(grads, parts, ps))
            hv = torch.autograd.grad(dot, ps, retain_graph=True, allow_unused=True, materialize_grads=True)
            rows.append(torch.cat([h.reshape(-1) for h in hv]))
    return torch.stack(rows)


def _relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    return max(float((g - r).norm() / r.norm()) for g, r in zip(got, ref))


def _losslens_warnings(caught) -> list:
    return [w for w in caught if issubclass(w.category, LosslensWarning)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lm_hessian_difference_products_match_a_double_backward_of_the_kept_token_loss(family, dtype):
    model, pad, batches = _setting(family, dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op = lm_hessian(model, batches, backend="difference")
        V = torch.randn(2, op.dim, generator=torch.Generator().manual_seed(1), dtype=op.dtype)
        got = op.matmat_flat(V)
    ref = _kept_token_hvps(model, op.space.names, batches, pad, V)
    err = _relative(got, ref)
    warned = _losslens_warnings(caught)
    assert err <= TOLERANCE[dtype] or warned, f"{family} {dtype}: products off by {err:.2g} and no LosslensWarning"
    # the padding is left out by lm_hessian: nothing to warn about there
    assert not [w for w in warned if issubclass(w.category, ZeroEmbeddingWarning)]
    assert op.excluded["zero_embedding_tokens"] == [pad]
    assert op.hvp_check["rel_error"] is not None  # measured before the operator was returned


def test_warnings_are_losslens_user_warnings_exported_from_geometry():
    for cls in (ProductErrorWarning, ZeroEmbeddingWarning):
        assert issubclass(cls, LosslensWarning) and issubclass(cls, UserWarning)
        assert cls.__name__ in geometry.__all__ and getattr(geometry, cls.__name__) is cls
    assert issubclass(LosslensWarning, UserWarning) and not issubclass(LosslensWarning, geometry.LosslensError)


def _kept(family: str = "llama", dtype: torch.dtype = torch.float64):
    model, pad, batches = _setting(family, dtype)
    return model, ExcludingLoss(lm_loss, (pad,)), batches


def test_a_bad_step_raises_under_the_error_filter_before_the_first_product_leaves():
    model, loss, batches = _kept()
    op = HessianOperator(model, loss, batches, backend=DifferenceBackend(step=0.5))
    V = torch.randn(1, op.dim, dtype=op.dtype, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ProductErrorWarning, match=r"error_tolerance=0\.02.*backend='difference'"):
            op.matmat_flat(V)  # nobody called checked(): the first product measures it
    assert op.hvp_check["rel_error"] > op.error_tolerance == 2e-2


def test_the_product_error_warning_is_emitted_once_and_points_at_the_caller():
    model, loss, batches = _kept()
    op = HessianOperator(model, loss, batches, backend=DifferenceBackend(step=0.5))
    V = torch.randn(2, op.dim, dtype=op.dtype, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op.matmat_flat(V)
        op.matmat_flat(V)
        op.checked()
        hutchinson_trace(op, num_matvecs=2)
    hits = [w for w in caught if issubclass(w.category, ProductErrorWarning)]
    assert len(hits) == 1 and hits[0].filename == __file__
    assert f"{op.hvp_check['rel_error']:.3g}" in str(hits[0].message)
    assert not [w for w in caught if issubclass(w.category, ZeroEmbeddingWarning)]  # the loss leaves the pad out


def test_the_warning_can_be_filtered_like_any_warning():
    model, loss, batches = _kept()
    op = HessianOperator(model, loss, batches, backend=DifferenceBackend(step=0.5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=LosslensWarning)
        op.matmat_flat(torch.ones(1, op.dim, dtype=op.dtype))
    assert not caught and op.hvp_check["rel_error"] > op.error_tolerance


def test_lm_hessian_warns_over_the_command_line_tolerance():
    model, _, batches = _setting("gpt_neox", torch.float64)
    with pytest.warns(ProductErrorWarning, match=rf"error_tolerance={ERROR_TOLERANCE:g}") as caught:
        op = lm_hessian(model, batches, backend=DifferenceBackend(step=0.5))
    assert op.error_tolerance == ERROR_TOLERANCE and op.hvp_check["rel_error"] > ERROR_TOLERANCE
    assert len([w for w in caught if issubclass(w.category, ProductErrorWarning)]) == 1


@pytest.mark.parametrize("backend", ["reverse", "forward"])
def test_exact_backends_emit_no_warning(backend):
    model, loss, batches = _kept()
    op = HessianOperator(model, loss, batches, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LosslensWarning)
        with float64_fidelity():
            op.matmat_flat(torch.ones(2, op.dim, dtype=op.dtype))
            hutchinson_trace(op, num_matvecs=2)
    assert op.checked() is None


def test_a_raw_operator_whose_loss_counts_zero_embedding_tokens_warns_naming_them():
    model, pad, batches = _setting("apertus", torch.float64)
    op = HessianOperator(model, lm_loss, batches)  # the README's raw path: the padding counted
    with pytest.warns(ZeroEmbeddingWarning, match=rf"token id\(s\) \[{pad}\].*lm_hessian") as caught:
        op.matmat_flat(torch.ones(1, op.dim, dtype=op.dtype))
    assert caught[0].filename == __file__
    with warnings.catch_warnings():  # once per operator, and never for a loss that leaves them out
        warnings.simplefilter("error", ZeroEmbeddingWarning)
        op.matmat_flat(torch.ones(1, op.dim, dtype=op.dtype))
        HessianOperator(model, ExcludingLoss(lm_loss, (pad,)), batches).matmat_flat(torch.ones(1, op.dim))


def test_float64_products_of_float32_weights_run_hf_float32_islands_in_float64():
    """``compute_dtype="float64"`` on float32 weights: the gradient differences' loss runs under float64
    fidelity (the set-up decides it from the compute dtype), so the products are float64-accurate
    against a double backward of the float64 copy, not float32-accurate."""
    model, pad, batches = _setting("llama", torch.float32)
    op = lm_hessian(model, batches, backend="difference", compute_dtype="float64")
    assert op.param_dtype == torch.float64
    V = torch.randn(2, op.dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref = _kept_token_hvps(copy.deepcopy(model).double(), op.space.names, batches, pad, V)
    assert _relative(op.matmat_flat(V), ref) <= TOLERANCE[torch.float64]


def _least_budget(model, batches, compute_dtype) -> int:
    """The smallest ``max_memory`` (bytes, to 1%) that the set-up's plan accepts, by bisection."""
    lo, hi = 1, 10**10
    while hi - lo > hi // 100:
        mid = (lo + hi) // 2
        try:
            plan_lm_setup(model, batches, check=False, max_memory=mid, compute_dtype=compute_dtype)
            hi = mid
        except MemoryBudgetError:
            lo = mid
    return hi


def test_the_set_up_plans_the_graph_floor_in_the_compute_dtype():
    """The reverse pass's graph floor is planned on the operator the products run on: with
    ``compute_dtype="float64"`` on float32 weights its graph, gradient and vectors are float64, so the
    least budget the plan accepts is 1.5–2.2× the float32 one (1.76× here; it was the same: the floor
    was measured in the weights' dtype, and a float64 run past it was refused only by the estimators)."""
    model = tiny_model("llama", seed=0, dtype=torch.float32, hidden_size=16, intermediate_size=32)
    batches = [torch.randint(3, 96, (2, 64), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    f32, f64 = _least_budget(model, batches, None), _least_budget(model, batches, "float64")
    setup = plan_lm_setup(model, batches, check=False, compute_dtype="float64")
    assert setup.compute_dtype == torch.float64
    assert 1.5 * f32 <= f64 <= 2.2 * f32, (f32, f64)
