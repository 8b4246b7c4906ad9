"""Loading checkpoints into one reused model instance, and computing derived (LAWA) weights.

:class:`CheckpointLoader` builds **one** model from the first loaded checkpoint's config and copies
each later checkpoint's weights into it (``Tensor.copy_``), after checking that the config's
``model_type`` and every parameter name and shape agree. Derived checkpoints
(:func:`~probes.checkpoints.derived.lawa`) are averaged here, one source at a time (float64
accumulation). :func:`load_model` builds a fresh model per call.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from .errors import ArchitectureMismatchError, CheckpointError, CorruptCheckpointError
from .files import is_ignorable_buffer, load_weight_file, local_folder, read_config, ref_weight_files
from .refs import CheckpointRef
from .trajectory import Trajectory

__all__ = ["CheckpointLoader", "load_model"]


class CheckpointLoader:
    """Loads checkpoints of one trajectory into **one** reused model instance.

    ``loader.load(ref)`` returns the same ``nn.Module`` every time, with ``ref``'s weights copied
    in (``ref``: a :class:`CheckpointRef`, a label or an index into the trajectory). The model is
    built on the first call from that checkpoint's ``config.json``
    (``AutoModelForCausalLM.from_config``), cast to ``dtype`` / moved to ``device`` (defaults: float32,
    CPU; stored weights of another dtype are converted on copy), and put in eval mode. Later checkpoints must have
    the same ``model_type`` and parameter names/shapes, or :class:`ArchitectureMismatchError` names the
    checkpoint. Anything that modifies the returned model in place (quantization with
    ``inplace=True``) is undone by the next ``load``. Cost: one weight-file read + copy per call;
    derived checkpoints read each source once.
    """

    def __init__(self, trajectory_or_ref: "Trajectory | CheckpointRef | str | Path", dtype: torch.dtype | None = None,
                 device: str | torch.device | None = None, allow_pickle: bool = False,
                 attn_implementation: str | None = None):
        if isinstance(trajectory_or_ref, Trajectory):
            self.trajectory = trajectory_or_ref
        elif isinstance(trajectory_or_ref, CheckpointRef):
            self.trajectory = Trajectory([trajectory_or_ref], trajectory_or_ref.label)
        else:
            self.trajectory = Trajectory.from_folder(trajectory_or_ref)
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else None
        self.allow_pickle = allow_pickle
        self.attn_implementation = attn_implementation
        self._model: nn.Module | None = None
        self._template: tuple[str, str] | None = None  # (label, model_type)
        self.current: CheckpointRef | None = None

    @property
    def model(self) -> nn.Module | None:
        """The reused model instance (None before the first :meth:`load`)."""
        return self._model

    def _ref(self, ref: "CheckpointRef | str | int") -> CheckpointRef:
        return ref if isinstance(ref, CheckpointRef) else self.trajectory[ref]

    def _build(self, ref: CheckpointRef) -> nn.Module:
        from transformers import AutoConfig, AutoModelForCausalLM

        folder = local_folder(ref)
        read_config(ref)  # specific error if missing
        try:
            config = AutoConfig.from_pretrained(str(folder))
        except Exception as exc:
            raise CorruptCheckpointError(f"checkpoint {ref.label!r}: transformers cannot read {folder / 'config.json'}: {exc}") from exc
        kwargs = {"attn_implementation": self.attn_implementation} if self.attn_implementation else {}
        model = AutoModelForCausalLM.from_config(config, **kwargs)
        model.to(device=self.device or torch.device("cpu"), dtype=self.dtype or torch.float32)
        model.eval()
        model.requires_grad_(True)
        self._template = (ref.label, str(getattr(config, "model_type", None)))
        return model

    def load(self, ref: "CheckpointRef | str | int") -> nn.Module:
        """The reused model holding ``ref``'s weights (eval mode)."""
        ref = self._ref(ref)
        base = ref
        while base.derived:
            if not base.sources:
                raise CheckpointError(f"derived checkpoint {ref.label!r} has no sources")
            base = base.sources[0]
        if self._model is None:
            self._model = self._build(base)
        else:
            for r in ([ref] if not ref.derived else list(_leaves(ref))):
                mt = str(read_config(r).get("model_type"))
                if mt != self._template[1]:
                    raise ArchitectureMismatchError(
                        f"checkpoint {r.label!r} is a {mt!r} model but this loader holds a {self._template[1]!r} model built "
                        f"from {self._template[0]!r}; a trajectory must have one architecture")
        state = self.state_dict(ref)
        self._copy_in(state, ref)
        self._model.eval()
        self.current = ref
        return self._model

    def _copy_in(self, state: dict[str, torch.Tensor], ref: CheckpointRef) -> None:
        model = self._model
        target = model.state_dict(keep_vars=True)
        state = _rename_legacy_keys(state, model, target)
        ptr_names: dict[int, list[str]] = {}
        for n, t in target.items():
            ptr_names.setdefault(id(t), []).append(n)
        params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
        missing = []
        for n, t in target.items():
            if n in state:
                continue
            if any(a in state for a in ptr_names[id(t)]):  # tied weights: present under another name
                continue
            if n in params:
                missing.append(n)
        unexpected = [k for k in state if k not in target and not is_ignorable_buffer(k)]
        who = f"checkpoint {ref.label!r}" + (f" ({ref.location})" if ref.location else "")
        tmpl = self._template[0] if self._template else "?"
        if missing or unexpected:
            raise ArchitectureMismatchError(
                f"{who} does not match the {type(model).__name__} built from {tmpl!r}: missing parameters "
                f"{missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected keys {unexpected[:5]}"
                f"{'...' if len(unexpected) > 5 else ''}")
        for n, t in target.items():
            if n in state and tuple(state[n].shape) != tuple(t.shape):
                raise ArchitectureMismatchError(f"{who}: parameter {n} has shape {tuple(state[n].shape)} but "
                                                f"{tuple(t.shape)} in the model built from {tmpl!r}")
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
            raise ArchitectureMismatchError(f"cannot average checkpoint {src.label!r} with {first_label!r} in "
                                            f"{ref.label!r}: parameter names differ ({diff})")
        for k, v in sd.items():
            if tuple(v.shape) != tuple(acc[k].shape):
                raise ArchitectureMismatchError(f"cannot average checkpoint {src.label!r} with {first_label!r} in "
                                                f"{ref.label!r}: {k} has shape {tuple(v.shape)} vs {tuple(acc[k].shape)}")
            if v.is_floating_point():
                acc[k] += v.to(torch.float64) * w
    return {k: v.to(dtypes[k]) for k, v in acc.items()}


def load_model(ref: "CheckpointRef | str | Path", dtype: torch.dtype | None = None, device: str | torch.device | None = None,
               allow_pickle: bool = False, attn_implementation: str | None = None) -> nn.Module:
    """A fresh model holding ``ref``'s weights (a ref or a checkpoint folder / weight file path).
    Same safety and checks as :class:`CheckpointLoader`; builds a new model each call."""
    if not isinstance(ref, CheckpointRef):
        ref = CheckpointRef.from_path(ref)
    return CheckpointLoader(ref, dtype, device, allow_pickle, attn_implementation).load(ref)


def _rename_legacy_keys(state: dict[str, torch.Tensor], model: nn.Module, target: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Map checkpoint keys the model does not know to its own names with transformers' renamings.

    transformers 5 renames some weights at load time and back at save time (GPT-NeoX stores its head
    as ``embed_out.weight`` — also in every real Pythia checkpoint — while the module is
    ``lm_head``). Only pure one-to-one renamings are applied; keys already known are kept as they are.
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
