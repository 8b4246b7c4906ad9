"""A miniature of a model's architecture, for checks whose cost must not grow with the model.

Whether an architecture's ops have correct second-order rules does not depend on its width or
depth, so :func:`losslens.lm.models.second_order.check_second_order` checks a large or half-precision
model on a float64 miniature of the same class: its config with the sizes shrunk (2 heads of 16,
hidden 32, MLP 64, at most 4 layers; vocabulary, special tokens, attention implementation, rotary
settings and per-layer patterns kept), random-initialised on the model's device. A 7B model is
then checked in milliseconds and a few MB, in float64, where finite differences are exact enough
(in bfloat16 a useful step is below half an ulp of most weights). :func:`working_model` picks the
model the check runs on (the model, a float64 copy or a miniature) and :func:`check_precision` the one
that fits a memory budget. :func:`miniature_bound` measures
the difference backend's error on a miniature where no exact product can run on the model itself.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Sequence

import torch
from torch import nn

from losslens.geometry.memory.budget import format_bytes
from losslens.geometry.operators.difference import DifferenceBackend
from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.operators.setup_plan import refusal
from losslens.lm.core.next_token_loss import lm_loss

from losslens.lm.models.fidelity import float64_fidelity
from losslens.lm.models.zero_embeddings import curvature_loss, zero_embedding_tokens

HEADS, HEAD_DIM, MLP, MAX_LAYERS = 2, 16, 64, 4
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")

#: Peak resident memory of the second-order check (2 × 16 tokens) in multiples of the float64
#: parameters it runs on (8 bytes each): measured 18.2 on a float64 copy of the Pythia 14M shape and
#: 27.4 on its miniature (3.25M parameters, the 50,304-token vocabulary kept, whose logits dominate),
#: float32 model, glibc's defaults (benchmarks/README.md, "Refusals"). Validated on that shape only.
CHECK_FACTOR = 28


def _shrunk_config(config: Any) -> Any:
    cfg = copy.deepcopy(config)
    layers_key = next((k for k in _LAYER_KEYS if isinstance(getattr(cfg, k, None), int)), None)
    if layers_key is None:
        raise ValueError("the config names no layer count")
    old_layers = getattr(cfg, layers_key)
    new_layers = min(old_layers, MAX_LAYERS)
    heads = getattr(cfg, "num_attention_heads", None)
    kv = getattr(cfg, "num_key_value_heads", None)
    new_heads = min(heads or HEADS, HEADS)
    updates: dict[str, Any] = {layers_key: new_layers, "initializer_range": 0.2, "use_cache": False}
    if heads:
        updates["num_attention_heads"] = new_heads
    if kv:
        updates["num_key_value_heads"] = 1 if kv < heads else new_heads
    for key, value in (("hidden_size", new_heads * HEAD_DIM), ("intermediate_size", MLP), ("head_dim", HEAD_DIM)):
        if isinstance(getattr(cfg, key, None), int):
            updates[key] = value
    for key, value in vars(cfg).items():  # per-layer lists follow the layer count
        if isinstance(value, (list, tuple)) and len(value) == old_layers and old_layers != new_layers:
            updates[key] = type(value)(value[:new_layers])
    for key, value in updates.items():
        setattr(cfg, key, value)
    return cfg


def miniature(model: nn.Module, dtype: torch.dtype = torch.float64) -> nn.Module | None:
    """A random-init miniature of ``model``'s class (HF ``PreTrainedModel`` with a ``config``) in
    ``dtype`` on the model's device, in eval mode; None when one cannot be built (not an HF model,
    or a config the shrinking does not fit). Cost: a model of ~10⁴–10⁶ parameters (the vocabulary
    is kept, so token ids stay valid)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    try:
        cfg = _shrunk_config(config)
        attn = getattr(config, "_attn_implementation", None)
        if attn is not None:
            cfg._attn_implementation = attn
        device = next(model.parameters()).device
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            mini = type(model)(cfg)
        return mini.to(device=device, dtype=dtype).eval()
    except Exception:  # noqa: BLE001 - any failure means "no miniature"; the caller says how it checks instead
        return None


def working_model(model: nn.Module, precision, messages: list[str], build=None) -> tuple[nn.Module, str]:
    """The model :func:`losslens.lm.models.second_order.check_second_order` runs on, and what it is:
    ``precision="native"`` the model; a torch dtype: the model in it (a copy when it differs);
    ``"auto"``: a float64 copy under 50M parameters (not half precision), else a float64
    :func:`miniature` (a float32 copy when none can be built); ``"miniature"``: the miniature
    whatever the size (no copy: a memory budget leaves no room for one). Notes go to ``messages``.
    ``build``: what makes the float64 miniature (default :func:`miniature`; a set-up passes its own,
    built once: :meth:`losslens.lm.models.lm_setup.LmSetup.miniature`)."""
    n_params = sum(p.numel() for p in model.parameters())
    model_dtype = next(model.parameters()).dtype
    if precision == "native":
        return model, "model"
    if isinstance(precision, torch.dtype):
        return (
            (model, "model") if precision == model_dtype else (copy.deepcopy(model).to(precision), f"{precision} copy")
        )
    if precision not in ("auto", "miniature"):
        raise ValueError(f"precision must be 'auto', 'miniature', 'native' or a torch dtype, got {precision!r}")
    if precision == "auto" and _copy_checked(n_params, model_dtype):
        return (model, "model") if model_dtype == torch.float64 else (copy.deepcopy(model).double(), "float64 copy")
    mini = miniature(model) if build is None else build()
    if mini is not None:
        messages.append(
            f"checked on a float64 miniature of {type(model).__name__} ({sum(p.numel() for p in mini.parameters())} "
            f"parameters): AD rules do not depend on width or depth, and the model has {n_params} parameters "
            f"in {str(model_dtype).replace('torch.', '')}"
        )
        return mini, "float64 miniature"
    if model_dtype in (torch.float16, torch.bfloat16):
        messages.append("no miniature of this architecture could be built; checked a float32 copy of the model")
        return copy.deepcopy(model).float(), "float32 copy"
    return model, "model"


def _copy_checked(n_params: int, dtype: torch.dtype) -> bool:
    """``precision="auto"``'s rule: a model under 50M parameters, not in half precision, is checked
    on a float64 copy (or itself, when float64); any other on a float64 miniature."""
    return n_params < 50_000_000 and dtype not in (torch.float16, torch.bfloat16)


def check_precision(model: nn.Module, budget: int, build=None) -> str:
    """The :func:`working_model` precision whose second-order check fits ``budget`` bytes
    (:data:`CHECK_FACTOR` × 8 bytes × the parameters it runs on): ``"auto"`` when the float64 copy (or
    the model itself, already float64) fits, else ``"miniature"`` when the miniature's check fits;
    else :class:`~losslens.geometry.memory.budget.MemoryBudgetError` (one line). Cost: a miniature built to
    count its parameters (``build()``: the set-up's, built once; default :func:`miniature`)."""
    n = sum(p.numel() for p in model.parameters())
    if _copy_checked(n, next(model.parameters()).dtype) and CHECK_FACTOR * 8 * n <= budget:
        return "auto"
    mini = miniature(model) if build is None else build()
    if mini is None:  # no miniature: the check runs on the model itself, as before (not bounded here)
        return "auto"
    need = CHECK_FACTOR * 8 * sum(p.numel() for p in mini.parameters())
    del mini
    if need > budget:
        raise refusal(
            "the second-order check",
            int(need),
            budget,
            f"{CHECK_FACTOR} × its float64 miniature's parameters; the float64 copy would need "
            f"{format_bytes(CHECK_FACTOR * 8 * n)}",
        )
    return "miniature"


def fill_zero_embedding_rows(work: nn.Module) -> None:
    """In the check's own copy: give all-zero input-embedding rows (padding rows are zero from
    initialisation) random values of the other rows' scale. At a zero row a normalisation layer is
    singular and no finite difference converges; AD rules do not depend on the row's values."""
    emb = getattr(work, "get_input_embeddings", None)
    weight = getattr(emb(), "weight", None) if callable(emb) else None
    if weight is None or weight.ndim != 2:
        return
    with torch.no_grad():
        zero = weight.abs().sum(1) == 0
        if zero.any() and not zero.all():
            g = torch.Generator().manual_seed(0)
            fill = torch.randn(int(zero.sum()), weight.shape[1], generator=g, dtype=torch.float64)
            weight[zero] = (fill * weight[~zero].double().std()).to(device=weight.device, dtype=weight.dtype)


def miniature_bound(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    seed: int = 0,
    exclude: Sequence[int] = (),
    compute_dtype=None,
    build=None,
) -> dict:
    """The difference backend's error where no exact product can run on the model itself: on a
    miniature of the architecture (:func:`miniature`, same class and config
    pattern) in the model's dtype, its products in ``compute_dtype`` (None: the default policy),
    against the exact reverse products of its float64 copy (HF's float32 islands in float64,
    :func:`~losslens.lm.models.fidelity.float64_fidelity`), on ``batches``, with the tokens ``exclude``
    and the miniature's own zero-embedding tokens left out of the loss.
    Returns ``{"rel_error", "reference"}`` (rel_error None when no miniature can be built). ``build()``:
    a float64 miniature (the set-up's, built once; default :func:`miniature`), cast to the model's
    dtype here (the same values as building it there: its float32 initialisation is exact in float64).
    Cost: a miniature (~10⁴–10⁶ parameters) and 2 products of each backend on the check batches."""
    from losslens.geometry.operators.product_check import product_error

    dtype = next(model.parameters()).dtype
    mini = miniature(model, dtype=dtype) if build is None else build()
    if mini is not None:
        mini = mini.to(dtype)
    if mini is None:
        return {"rel_error": None, "reference": "unavailable: no exact product on the model and no miniature of it"}
    exact = copy.deepcopy(mini).double()
    left_out = sorted(set(exclude) | set(zero_embedding_tokens(mini)))  # the model's, and the miniature's own
    loss_fn = curvature_loss(lm_loss, left_out)
    with float64_fidelity():
        ref = HessianOperator(exact, loss_fn, list(batches))
        diff = HessianOperator(
            mini, loss_fn, list(batches), backend=DifferenceBackend.name, compute_dtype=compute_dtype
        )
        diff.verify_products = False  # its error is what this measures (and the caller reports)
        error = product_error(diff, ref, 2, seed)
    name = str(dtype).replace("torch.", "")
    computed = str(diff.compute_dtype).replace("torch.", "")
    name = name if computed == name else f"{name} (computed in {computed})"
    return {
        "rel_error": error,
        "reference": f"bound on a {name} miniature of {type(model).__name__} "
        f"({sum(p.numel() for p in mini.parameters())} parameters) against its float64 reverse products "
        "(no exact product can run on the model)",
    }


__all__ = [
    "CHECK_FACTOR",
    "check_precision",
    "fill_zero_embedding_rows",
    "miniature",
    "miniature_bound",
    "working_model",
]
