"""Loading checkpoints into a reused model instance, and computing derived (LAWA) weights.

:class:`CheckpointLoader` evaluates every checkpoint under its **own** ``config.json``. It keeps
one model and copies each checkpoint's weights into it (``Tensor.copy_``) as long as the
checkpoints' function configs (:func:`~losslens.lm.checkpoints.configs.function_config`) are equal; a
checkpoint whose config differs gets a model built from its config. Every build starts on the meta
device: the model's parameter count, names and shapes are checked against the weight files'
headers before anything is allocated. Derived checkpoints (:func:`~losslens.lm.checkpoints.derived.lawa`)
are averaged here, one source at a time (float64 accumulation); their sources must share one
function config. :func:`load_model` builds a fresh model per call.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from losslens.lm.checkpoints.configs import check_fits_weights, config_differences, config_key, match_shapes, meta_model
from losslens.lm.checkpoints.errors import ArchitectureMismatchError, CheckpointError, CorruptCheckpointError
from losslens.lm.checkpoints.files import file_shapes, load_weight_file, local_folder, read_config, ref_weight_files
from losslens.lm.checkpoints.refs import CheckpointRef
from losslens.lm.checkpoints.trajectory import Trajectory

__all__ = ["CheckpointLoader", "load_model", "usable_device"]


class CheckpointLoader:
    """Loads checkpoints of one trajectory, each under its own config, into a reused model.

    ``loader.load(ref)`` returns the model with ``ref``'s weights copied in (``ref``: a
    :class:`CheckpointRef`, a label or an index into the trajectory). The model is built from the
    checkpoint's ``config.json`` (``AutoModelForCausalLM.from_config``), cast to ``dtype`` / moved to
    ``device`` (defaults: float32, CPU; stored weights of another dtype are converted on copy), and
    put in eval mode. The same instance is returned for every later checkpoint whose function
    config is equal (the usual trajectory); a checkpoint whose config differs in anything that
    changes the function gets a new model built from its own config (the previous one is dropped).
    Before any model is allocated it is built on the meta device and checked against the weight
    files' headers: more parameters than the files hold, or other names/shapes, raise
    :class:`ArchitectureMismatchError` naming the checkpoint (and both sizes). Anything that
    modifies the returned model in place (quantization with ``inplace=True``) is undone by the next
    ``load``. Cost: one weight-file read + copy per call; a header read and a meta build when the
    config changes; derived checkpoints read each source once.
    """

    def __init__(
        self,
        trajectory_or_ref: "Trajectory | CheckpointRef | str | Path",
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        allow_pickle: bool = False,
        attn_implementation: str | None = None,
    ):
        if isinstance(trajectory_or_ref, Trajectory):
            self.trajectory = trajectory_or_ref
        elif isinstance(trajectory_or_ref, CheckpointRef):
            self.trajectory = Trajectory([trajectory_or_ref], trajectory_or_ref.label)
        else:
            self.trajectory = Trajectory.from_folder(trajectory_or_ref)
        self.dtype = dtype
        self.device = usable_device(device)
        self.allow_pickle = allow_pickle
        self.attn_implementation = attn_implementation
        self._model: nn.Module | None = None
        self._template: tuple[str, str] | None = None  # (label, model_type) of the checkpoint the model was built from
        self._key: str | None = None  # function config of the current model
        self.current: CheckpointRef | None = None

    @property
    def model(self) -> nn.Module | None:
        """The current model instance (None before the first :meth:`load`)."""
        return self._model

    def _ref(self, ref: "CheckpointRef | str | int") -> CheckpointRef:
        return ref if isinstance(ref, CheckpointRef) else self.trajectory[ref]

    def config(self, ref: "CheckpointRef | str | int"):
        """``ref``'s transformers config (derived: its first source's), read from its config.json."""
        from transformers import AutoConfig

        ref = self._ref(ref)
        base = next(_leaves(ref)) if ref.derived else ref
        folder = local_folder(base)
        read_config(base)  # specific error if missing / not JSON
        try:
            return AutoConfig.from_pretrained(str(folder))
        except Exception as exc:
            raise CorruptCheckpointError(
                f"checkpoint {base.label!r}: transformers cannot read {folder / 'config.json'}: {exc}"
            ) from exc

    def _build(self, ref: CheckpointRef, config) -> nn.Module:
        """A model for ``config``: built on the meta device, checked against ``ref``'s weight headers,
        then allocated (random init, overwritten by the copy) on the loader's device and dtype."""
        from transformers import AutoModelForCausalLM

        who = f"checkpoint {ref.label!r}" + (f" ({ref.location})" if ref.location else "")
        cfg_path = f"{ref.label}/config.json"
        meta = meta_model(config, ref.label, self.attn_implementation)
        shapes = file_shapes(ref_weight_files(ref), ref.label, self.allow_pickle)
        shapes = _rename_legacy_keys(shapes, meta, meta.state_dict(keep_vars=True))
        check_fits_weights(meta, shapes, who, cfg_path, self.dtype, raw_config=read_config(ref))
        del meta
        kwargs = {"attn_implementation": self.attn_implementation} if self.attn_implementation else {}
        model = AutoModelForCausalLM.from_config(config, **kwargs)
        model.to(device=self.device or torch.device("cpu"), dtype=self.dtype or torch.float32)
        model.eval()
        model.requires_grad_(True)
        self._template = (ref.label, str(getattr(config, "model_type", None)))
        return model

    def load(self, ref: "CheckpointRef | str | int") -> nn.Module:
        """The model holding ``ref``'s weights under ``ref``'s own config (eval mode)."""
        ref = self._ref(ref)
        if ref.derived and not ref.sources:
            raise CheckpointError(f"derived checkpoint {ref.label!r} has no sources")
        leaves = list(_leaves(ref)) if ref.derived else [ref]
        config = self.config(leaves[0])
        key = config_key(config)
        for other in leaves[1:]:
            cfg = self.config(other)
            if config_key(cfg) != key:
                diff = config_differences(config.to_dict(), cfg.to_dict())
                raise ArchitectureMismatchError(
                    f"cannot average checkpoint {other.label!r} with {leaves[0].label!r} in "
                    f"{ref.label!r}: their configs differ in {diff}"
                )
        if self._model is None or key != self._key:
            self._model, self._key, self.current = None, None, None
            gc.collect()
            self._model = self._build(leaves[0], config)
            self._key = key
        state = self.state_dict(ref)
        self._copy_in(state, ref)
        self._model.eval()
        self.current = ref
        return self._model

    def _copy_in(self, state: dict[str, torch.Tensor], ref: CheckpointRef) -> None:
        model = self._model
        target = model.state_dict(keep_vars=True)
        state = _rename_legacy_keys(state, model, target)
        who = f"checkpoint {ref.label!r}" + (f" ({ref.location})" if ref.location else "")
        tmpl = repr(self._template[0]) if self._template else "?"
        match_shapes(model, {k: tuple(v.shape) for k, v in state.items()}, who, tmpl)
        with torch.no_grad():
            for n, t in target.items():
                if n in state:
                    t.copy_(state[n])

    def state_dict(self, ref: "CheckpointRef | str | int") -> dict[str, torch.Tensor]:
        """``ref``'s weights as a dict of CPU tensors in their stored dtype (derived: the weighted
        mean, accumulated in float64 and cast back to the first source's dtypes)."""
        ref = self._ref(ref)
        if ref.derived:
            return _average(ref, self)
        state: dict[str, torch.Tensor] = {}
        for f in ref_weight_files(ref):
            state.update(load_weight_file(f, self.allow_pickle, ref.label))
        return state


def usable_device(device) -> torch.device | None:
    """``torch.device(device)`` after one tiny allocation on it, or :class:`CheckpointError` saying why not."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
        torch.empty(1, device=dev)
    except Exception as exc:  # unknown device string, no CUDA build / no GPU, index out of range
        raise CheckpointError(
            f"device {str(device)!r} cannot be used here ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); use 'cpu', 'cuda', "
            "'cuda:1', 'mps' ... as this machine has them"
        ) from exc
    return dev


def _leaves(ref: CheckpointRef) -> Iterator[CheckpointRef]:
    if ref.derived:
        for s in ref.sources:
            yield from _leaves(s)
    else:
        yield ref


def _average(ref: CheckpointRef, loader: CheckpointLoader) -> dict[str, torch.Tensor]:
    """Weighted mean of the sources' state dicts, reading one source at a time (memory: 2 copies)."""
    sources = ref.sources
    if not sources:
        raise CheckpointError(f"derived checkpoint {ref.label!r} has no sources")
    weights = ref.weights or tuple([1.0 / len(sources)] * len(sources))
    acc: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    first_label = sources[0].label
    for i, (src, w) in enumerate(zip(sources, weights)):
        sd = loader.state_dict(src)
        if i == 0:
            for k, v in sd.items():
                dtypes[k] = v.dtype
                acc[k] = v.to(torch.float64) * w if v.is_floating_point() else v.clone()
            continue
        if set(sd) != set(acc):
            diff = sorted(set(sd) ^ set(acc))[:5]
            raise ArchitectureMismatchError(
                f"cannot average checkpoint {src.label!r} with {first_label!r} in "
                f"{ref.label!r}: parameter names differ ({diff})"
            )
        for k, v in sd.items():
            if tuple(v.shape) != tuple(acc[k].shape):
                raise ArchitectureMismatchError(
                    f"cannot average checkpoint {src.label!r} with {first_label!r} in "
                    f"{ref.label!r}: {k} has shape {tuple(v.shape)} vs {tuple(acc[k].shape)}"
                )
            if v.is_floating_point():
                acc[k] += v.to(torch.float64) * w
    return {k: v.to(dtypes[k]) for k, v in acc.items()}


def load_model(
    ref: "CheckpointRef | str | Path",
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    allow_pickle: bool = False,
    attn_implementation: str | None = None,
) -> nn.Module:
    """A fresh model holding ``ref``'s weights (a ref or a checkpoint folder / weight file path).
    Same safety and checks as :class:`CheckpointLoader`; builds a new model each call."""
    if not isinstance(ref, CheckpointRef):
        ref = CheckpointRef.from_path(ref)
    return CheckpointLoader(ref, dtype, device, allow_pickle, attn_implementation).load(ref)


def _rename_legacy_keys(state: dict[str, Any], model: nn.Module, target: Mapping[str, Any]) -> dict[str, Any]:
    """Map checkpoint keys the model does not know to its own names with transformers' renamings.

    transformers 5 renames some weights at load time and back at save time (GPT-NeoX stores its head
    as ``embed_out.weight`` — also in every real Pythia checkpoint — while the module is
    ``lm_head``). Only pure one-to-one renamings are applied; keys already known are kept as they are.
    Values are passed through untouched (tensors, or shapes for a header check).
    """
    unknown = [k for k in state if k not in target]
    if not unknown:
        return state
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        renamings = [t for t in get_model_conversion_mapping(model) if type(t) is WeightRenaming]
    except Exception:  # older/newer transformers without this API: nothing to rename
        return state
    out = dict(state)
    for key in unknown:
        for rule in renamings:
            new, matched = rule.rename_source_key(key)
            if matched is not None and new in target and new not in out:
                out[new] = out.pop(key)
                break
    return out
