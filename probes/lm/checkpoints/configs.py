"""A checkpoint's config against its weights, before anything is allocated.

Every checkpoint is evaluated under its **own** ``config.json``. What the loader needs for that:

- :func:`function_config` -- the parts of a config that change the function (the config as
  transformers fills it in, without bookkeeping keys such as ``transformers_version`` or
  ``use_cache``). Two checkpoints whose function configs are equal can share one model instance.
- :func:`config_differences` -- which keys differ between two function configs.
- :func:`meta_model` -- the model a config describes, built on the ``meta`` device (no memory).
- :func:`check_fits_weights` -- the meta model's parameter count, names and shapes against the
  weight files' headers (safetensors: header only). A config that would allocate more than the
  weights hold (e.g. a minimal ``{"model_type": "gpt_neox"}`` that falls back to transformers'
  20.5B-parameter defaults) is an error naming both sizes, raised before a byte is allocated.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import torch
from torch import nn

from losslens.lm.checkpoints.errors import ArchitectureMismatchError, CorruptCheckpointError
from losslens.lm.checkpoints.files import is_ignorable_buffer, read_config

__all__ = [
    "function_config",
    "config_key",
    "config_differences",
    "differing_configs",
    "meta_model",
    "check_fits_weights",
    "match_shapes",
    "NON_FUNCTION_KEYS",
]

NON_FUNCTION_KEYS = frozenset(
    {
        "_name_or_path",
        "architectures",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "id2label",
        "label2id",
        "problem_type",
        "initializer_range",
        "bos_token_id",
        "eos_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "_commit_hash",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "_attn_implementation_internal",
        "tokenizer_class",
        "task_specific_params",
        "finetuning_task",
        "prefix",
        "chunk_size_feed_forward",
        "torchscript",
        "use_bfloat16",
        "return_dict_in_generate",
        "output_scores",
        "max_length",
        "min_length",
        "do_sample",
        "num_beams",
        "temperature",
        "top_k",
        "top_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "early_stopping",
        "num_return_sequences",
        "bad_words_ids",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "suppress_tokens",
        "begin_suppress_tokens",
        "diversity_penalty",
        "num_beam_groups",
        "typical_p",
    }
)
"""Config keys that never change the model's function given its weights (bookkeeping, generation
defaults, initialisation). Everything else counts: an unknown key that differs makes the loader
build a new model (correct, only slower), never reuse a wrong one."""


def function_config(config: Any) -> dict:
    """The function-relevant part of a transformers config (or its dict) as plain JSON data."""
    d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return {k: v for k, v in sorted(d.items()) if k not in NON_FUNCTION_KEYS}


def config_key(config: Any) -> str:
    """A canonical string of :func:`function_config` (equal strings = same function)."""
    return json.dumps(function_config(config), sort_keys=True, default=str)


def config_differences(a: Mapping, b: Mapping) -> dict[str, tuple]:
    """``{key: (value in a, value in b)}`` for the function-relevant keys on which ``a`` and ``b`` differ."""
    fa, fb = function_config(a), function_config(b)
    return {k: (fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)}


def _filled(raw: Mapping) -> dict:
    """A config.json dict as transformers fills it in (defaults for what it leaves out)."""
    from transformers import AutoConfig

    rest = {k: v for k, v in raw.items() if k != "model_type"}
    return AutoConfig.for_model(raw["model_type"], **rest).to_dict()


def differing_configs(refs) -> tuple[str, dict[str, dict[str, tuple]]] | None:
    """``(first label, {label: differences})`` for the checkpoints whose function config differs
    from the first readable one's; None when all agree. Reads config.json only (no weights);
    unreadable configs are skipped (their load fails with its own message)."""
    first, out = None, {}
    for ref in refs:
        try:
            cfg = _filled(read_config(ref))
        except Exception:  # noqa: BLE001 - best effort: a config transformers cannot read fails when loaded
            continue
        if first is None:
            first = (str(ref.label), cfg)
            continue
        diff = config_differences(first[1], cfg)
        if diff:
            out[str(ref.label)] = diff
    return (first[0], out) if out else None


def meta_model(config, label: str, attn_implementation: str | None = None) -> nn.Module:
    """``AutoModelForCausalLM.from_config(config)`` on the meta device: shapes only, no memory."""
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, **kwargs)
    except Exception as exc:  # unknown model_type, inconsistent sizes (hidden % heads != 0), ...
        raise CorruptCheckpointError(
            f"checkpoint {label!r}: transformers cannot build a model from its config.json "
            f"({type(exc).__name__}: {exc})"
        ) from exc


def _gb(n_bytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{int(n_bytes)} B"


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def match_shapes(model: nn.Module, shapes: Mapping[str, tuple], who: str, built_from: str) -> None:
    """Raise :class:`ArchitectureMismatchError` unless ``shapes`` (name -> shape, after legacy
    renames) give every parameter of ``model`` (tied weights under either name) with its shape and
    hold no unexpected key (ignorable buffers aside)."""
    target = model.state_dict(keep_vars=True)
    ptr_names: dict[int, list[str]] = {}
    for n, t in target.items():
        ptr_names.setdefault(id(t), []).append(n)
    params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    missing = [
        n
        for n, t in target.items()
        if n not in shapes and n in params and not any(a in shapes for a in ptr_names[id(t)])
    ]
    unexpected = [k for k in shapes if k not in target and not is_ignorable_buffer(k)]
    if missing or unexpected:
        raise ArchitectureMismatchError(
            f"{who} does not match the {type(model).__name__} built from {built_from}: missing parameters "
            f"{missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected keys {unexpected[:5]}"
            f"{'...' if len(unexpected) > 5 else ''}"
        )
    for n, t in target.items():
        if n in shapes and tuple(shapes[n]) != tuple(t.shape):
            raise ArchitectureMismatchError(
                f"{who}: parameter {n} has shape {tuple(shapes[n])} but "
                f"{tuple(t.shape)} in the model built from {built_from}"
            )


_SIZE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "n_embd",
    "n_layer",
    "n_head",
    "d_model",
)


def check_fits_weights(
    model: nn.Module,
    shapes: Mapping[str, tuple],
    who: str,
    config_path: str,
    dtype: torch.dtype | None = None,
    raw_config: Mapping | None = None,
) -> None:
    """Check a (meta) ``model`` against the weight-file ``shapes`` before allocating it.

    First the size: a model with more parameters than the files hold is refused with both sizes
    (and the bytes it would allocate in ``dtype``, default float32), naming the size keys that
    ``raw_config`` (the config.json as written) leaves to transformers' defaults; then names and
    shapes (:func:`match_shapes`). ``shapes`` must already carry the model's own key names (legacy
    renames applied)."""
    need = sum(p.numel() for p in model.parameters())
    have = sum(int(torch.Size(s).numel()) for k, s in shapes.items() if not is_ignorable_buffer(k))
    if need > have:
        itemsize = torch.empty((), dtype=dtype or torch.float32).element_size()
        filled = [k for k in _SIZE_KEYS if raw_config is not None and k not in raw_config and hasattr(model.config, k)]
        why = (
            f"config.json leaves out {', '.join(filled)}, so transformers filled in its defaults"
            if filled
            else "the sizes in config.json do not match the weights"
        )
        raise ArchitectureMismatchError(
            f"{who}: {config_path} describes a {type(model).__name__} of {_count(need)} parameters "
            f"({_gb(need * itemsize)} in {str(dtype or torch.float32).replace('torch.', '')}), but its weight "
            f"files hold {_count(have)} parameters ({_gb(have * itemsize)}): {why}. Nothing was allocated; "
            "fix config.json (model.config.save_pretrained writes a complete one)."
        )
    match_shapes(model, shapes, who, config_path)
