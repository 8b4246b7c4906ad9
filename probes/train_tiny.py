"""The embedded default trajectory: a tiny GPT-NeoX trained here, on CPU, on the embedded corpus.

A nanoGPT-style loop -- read it top to bottom:

1. **Data** (:func:`prepare_data`). The embedded corpus (:mod:`probes.data`) is split by document
   hash into *train* (~90%) and *held-out* (~10%) parts. A byte-level BPE with ``vocab_size``
   entries is trained on the train part only; both parts are tokenized into streams. The tokenizer
   and streams are cached in ``OUT/data/`` (keyed by the corpus hash, vocab size and tokenizers
   version), so reruns skip this. The validation set -- ``val_batches`` batches of
   ``[batch_size, seq_len]`` non-overlapping windows of the held-out stream -- is saved as
   ``OUT/validation.safetensors``; it never overlaps the training text.
2. **Model**: ``GPTNeoXForCausalLM`` from a ``GPTNeoXConfig`` (eager attention, untied embeddings,
   no dropout), initialised after ``torch.manual_seed(seed)``.
3. **Loop**: ``steps`` AdamW updates (betas 0.9/0.95, decoupled weight decay on matrices and
   embeddings, none on biases and LayerNorms), gradient-norm clipping, LR from :func:`lr_at`.
   Batch ``t`` is ``batch_size`` random windows of the train stream drawn with a generator seeded
   by ``(data_seed, t)`` -- so the data order depends only on the step, which makes resuming and
   forking exact.
4. **Checkpoints**: at ``checkpoints`` evenly spaced steps (the last is ``steps``),
   ``OUT/step-000100/`` gets ``config.json``, ``model.safetensors`` and the tokenizer files
   (plus ``training_state.pt`` with the AdamW state when ``save_optimizer``), and
   ``OUT/trajectory.json`` is rewritten with, per checkpoint: step, tokens seen
   (``step * batch_size * seq_len``), the LR of the last update, the mean training loss since the
   previous checkpoint, and the validation loss (:func:`probes.lm.evaluate` on the validation set).

Schedules (``wsd`` / ``cosine`` / ``constant`` / ``linear``) are the pure functions of
:mod:`probes.schedules`; :func:`lr_at` picks one from the config.

Sweeps: :func:`train_sweep` (``losslens train-tiny --sweep lr=1e-3,3e-3 --sweep wd=0.1,0.5
--seeds 0,1``) trains the cartesian product of config values, one folder per run named like
``wsd-lr3e-3-wd0.5-s0``, indexed in ``OUT/sweep.json``; reruns skip finished runs.

Schedule forks (continue a checkpoint under cosine / SGDR / oscillating schedules, compare the
forks' quantization gaps) live in :mod:`probes.forks` and reuse :func:`run_loop`.

Resuming: ``train_tiny(cfg, out, resume_from=ckpt_dir)`` loads a checkpoint's weights
(and AdamW state when it has ``training_state.pt``; otherwise the moments restart from zero --
documented in ``trajectory.json``) and continues at its step under ``cfg``'s schedule. Rerunning
``train_tiny`` with the same config into a finished folder returns the existing trajectory.

Measured on 2 CPU cores with 1 thread: the default (0.17M params, 800 steps of 32x64) takes
about 1–1.5 min (9 s per 100 steps); the former 1.06M preset (hidden 128, 4 layers, 600 steps of
32x128) a few minutes; ``TrainConfig.tiny()`` a few seconds.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import schedules
from .checkpoints import CheckpointRef, Trajectory
from .lm import evaluate, lm_loss
from .tokenset import TokenSet

__all__ = ["TrainConfig", "TrainError", "lr_at", "train_tiny", "prepare_data", "build_model", "build_optimizer",
           "get_batch", "save_checkpoint", "run_loop", "SCHEDULES", "train_sweep", "plan_sweep", "parse_sweep",
           "sweep_run_name", "format_value", "SWEEP_ALIASES"]

SCHEDULES = ("wsd", "cosine", "constant", "linear")
FORMAT = "losslens-trajectory/1"


class TrainError(ValueError):
    """Bad training config, or an output folder that holds a different run."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a tiny training run (same config -> same weights).

    Schedule: ``warmup`` and ``decay`` are fractions of ``steps``; the LR rises linearly to
    ``peak_lr`` over the warmup, then ``wsd`` holds it and decays linearly to
    ``min_lr_ratio * peak_lr`` over the last ``decay`` fraction; ``cosine`` / ``linear`` decay from
    the end of warmup to the end; ``constant`` holds it. See :func:`lr_at`.

    The defaults (0.17M-parameter GPT-NeoX, 800 steps of 32×64 tokens, weight decay 1.0) are the
    embedded trajectory of ``losslens demo``: chosen so that the weight norm reaches equilibrium
    within the budget (1/(lr·wd) ≤ 330 steps) and the quantization effect of the LR decay is
    measurable above checkpoint noise (SCIENCE.md §8; measured effect sizes with 3-seed intervals
    in benchmarks/README.md). About 1–1.5 min per run on 2 CPU cores with 1 thread.
    """

    schedule: str = "wsd"
    peak_lr: float = 3e-3
    steps: int = 800
    checkpoints: int = 8
    seed: int = 0
    warmup: float = 0.05
    decay: float = 0.2
    min_lr_ratio: float = 0.0
    weight_decay: float = 1.0
    batch_size: int = 32
    seq_len: int = 64
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int | None = None  # default 4 * hidden_size
    vocab_size: int = 512
    grad_clip: float = 1.0
    val_batches: int = 8
    beta1: float = 0.9
    beta2: float = 0.95
    data_seed: int | None = None  # default: seed
    docstrings: bool = True  # corpus: pydoc topics + stdlib docstrings (False: topics only)
    save_optimizer: bool = False
    name: str | None = None

    @classmethod
    def tiny(cls, **overrides: Any) -> "TrainConfig":
        """The ``--tiny`` preset for tests and smoke runs: ~60k parameters, 60 steps of 8x32, 3
        checkpoints; a few seconds on 2 cores (plus ~5 s of one-off data preparation)."""
        base = dict(steps=60, checkpoints=3, batch_size=8, seq_len=32, hidden_size=32, num_layers=2, num_heads=2,
                    vocab_size=512, val_batches=2, warmup=0.1, weight_decay=0.1)
        base.update(overrides)
        return cls(**base)

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise TrainError(f"unknown schedule {self.schedule!r}; choose one of {SCHEDULES}")
        if self.steps < 1 or self.checkpoints < 1 or self.checkpoints > self.steps:
            raise TrainError(f"need steps >= 1 and 1 <= checkpoints <= steps (got steps={self.steps}, "
                             f"checkpoints={self.checkpoints})")
        for name in ("warmup", "decay", "min_lr_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise TrainError(f"{name} must be a fraction in [0, 1], got {getattr(self, name)}")
        if self.schedule == "wsd" and self.warmup + self.decay > 1.0:
            raise TrainError(f"wsd: warmup + decay fractions exceed 1 ({self.warmup} + {self.decay})")
        if self.peak_lr <= 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise TrainError("peak_lr must be > 0, weight_decay and grad_clip >= 0")
        if self.hidden_size % self.num_heads:
            raise TrainError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.seq_len < 2 or self.batch_size < 1 or self.val_batches < 1:
            raise TrainError("need seq_len >= 2, batch_size >= 1 and val_batches >= 1")

    @property
    def run_name(self) -> str:
        """``name``, or ``tiny-{schedule}-lr{peak_lr}-wd{weight_decay}-s{seed}`` (e.g. ``tiny-wsd-lr3e-3-wd0.1-s0``)."""
        return self.name or (f"tiny-{self.schedule}-lr{format_value(self.peak_lr)}-wd{format_value(self.weight_decay)}"
                             f"-s{self.seed}")

    @property
    def checkpoint_steps(self) -> list[int]:
        """Steps at which checkpoints are written: ``round(steps * i / checkpoints)``, i = 1..checkpoints."""
        return sorted({max(1, round(self.steps * i / self.checkpoints)) for i in range(1, self.checkpoints + 1)})

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def lr_at(step: int, config: TrainConfig) -> float:
    """Learning rate of the optimizer update that produces step ``step`` (1-based: update 1 turns
    the initial weights into step 1). Pure function of (step, config); see :class:`TrainConfig`
    and the schedule functions in :mod:`probes.schedules`."""
    peak, low, total = config.peak_lr, config.peak_lr * config.min_lr_ratio, config.steps
    warm = round(config.warmup * total)
    if config.schedule == "constant":
        return schedules.constant_lr(step, peak, warm)
    if config.schedule == "wsd":
        return schedules.wsd_lr(step, total, peak, low, warm, round(config.decay * total))
    if config.schedule == "cosine":
        return schedules.cosine_lr(step, total, peak, low, warm)
    return schedules.linear_lr(step, total, peak, low, warm)


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------

def prepare_data(config: TrainConfig, out_dir: str | Path, data_dir: str | Path | None = None
                 ) -> tuple[Any, torch.Tensor, TokenSet]:
    """(tokenizer, train stream [n_train] int64, validation TokenSet [val_batches, batch, seq]).

    Cached in ``data_dir`` (default ``out_dir/data/``; runs may share one): the trained tokenizer
    and both token streams, reused when the Python build (whose stdlib *is* the corpus), vocab size,
    corpus options and tokenizers version match; ``data.json`` records the corpus SHA-256. The
    validation set is written to ``out_dir/validation.safetensors``. Cost the first time: ~3 s
    corpus + ~2 s BPE training + ~2 s tokenization (2 cores, unloaded); cached: < 1 s.
    """
    import sys
    import sysconfig

    import tokenizers
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from .data import (HELDOUT_MODULUS, TextSource, embedded_documents, token_sets_from_stream, token_stream,
                       tokenizer_fingerprint, tokenizer_name, train_bpe_tokenizer)

    out = Path(out_dir)
    cache = Path(data_dir) if data_dir is not None else out / "data"
    key = {"format": 1, "python": sys.version, "stdlib": sysconfig.get_paths()["stdlib"],
           "vocab_size": config.vocab_size, "docstrings": config.docstrings, "heldout_modulus": HELDOUT_MODULUS,
           "tokenizers": tokenizers.__version__}
    info_path = cache / "data.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    if info.get("key") == key and (cache / "streams.safetensors").is_file():
        tok = AutoTokenizer.from_pretrained(str(cache / "tokenizer"))
        streams = load_file(str(cache / "streams.safetensors"))
        train, heldout = streams["train"], streams["heldout"]
    else:
        train_docs = embedded_documents(config.docstrings, "train")
        h = hashlib.sha256()
        for name, text in train_docs:
            h.update(name.encode() + b"\0" + text.encode() + b"\0")
        train_bpe_tokenizer([t for _, t in train_docs], config.vocab_size, cache / "tokenizer",
                            name=f"losslens-bpe-{config.vocab_size}")
        tok = AutoTokenizer.from_pretrained(str(cache / "tokenizer"))  # exactly what checkpoints will load
        train = token_stream(tok, TextSource.embedded("train", config.docstrings))
        heldout = token_stream(tok, TextSource.embedded("heldout", config.docstrings))
        save_file({"train": train.contiguous(), "heldout": heldout.contiguous()}, str(cache / "streams.safetensors"))
        info = {"key": key, "train_corpus_sha256": h.hexdigest(), "train_tokens": len(train),
                "heldout_tokens": len(heldout)}
        _write_json(info_path, info)
    if len(train) < config.seq_len + 1:
        raise TrainError(f"the training stream has {len(train)} tokens, fewer than one sequence of {config.seq_len}")
    shapes = {"validation": (config.val_batches, config.batch_size, config.seq_len)}
    meta = {"source": "embedded[heldout]", "split": "heldout", "tokenizer": tokenizer_name(tok),
            "tokenizer_fingerprint": tokenizer_fingerprint(tok)}
    val = token_sets_from_stream(heldout, shapes, _data_seed(config), meta,
                                 source_name="the held-out stream of the embedded corpus")["validation"]
    val.save(out / "validation.safetensors")
    return tok, train, val


def _data_seed(config: TrainConfig) -> int:
    return config.seed if config.data_seed is None else config.data_seed


def get_batch(stream: torch.Tensor, step: int, config: TrainConfig) -> torch.Tensor:
    """Batch of update ``step``: [batch_size, seq_len] random windows of ``stream``, seeded by
    (data_seed, step) only -- identical whether the run was resumed or not."""
    g = torch.Generator().manual_seed(_data_seed(config) * 1_000_003 + step)
    starts = torch.randint(0, len(stream) - config.seq_len + 1, (config.batch_size,), generator=g)
    return stream[starts[:, None] + torch.arange(config.seq_len)[None, :]]


# --------------------------------------------------------------------------------------------
# model and optimizer
# --------------------------------------------------------------------------------------------

def build_model(config: TrainConfig, tokenizer: Any = None) -> nn.Module:
    """A freshly initialised ``GPTNeoXForCausalLM`` (eager attention) for ``config``; seeded by
    ``config.seed``. Context length = ``seq_len``."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    eos = getattr(tokenizer, "eos_token_id", None)
    eos = 0 if eos is None else eos
    cfg = GPTNeoXConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, intermediate_size=config.intermediate_size or 4 * config.hidden_size,
        max_position_embeddings=config.seq_len, tie_word_embeddings=False, bos_token_id=eos, eos_token_id=eos,
        attention_dropout=0.0, hidden_dropout=0.0, use_cache=False, attn_implementation="eager")
    torch.manual_seed(config.seed)
    return GPTNeoXForCausalLM(cfg)


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on every >= 2-D parameter (matrices, embeddings), none on biases/norms."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.peak_lr, betas=(config.beta1, config.beta2), eps=1e-8)


def save_checkpoint(folder: Path, model: nn.Module, tokenizer: Any, optimizer: torch.optim.Optimizer | None = None,
                    step: int | None = None) -> None:
    """Write an HF checkpoint: config.json, model.safetensors, tokenizer files (+ training_state.pt)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(folder))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    if optimizer is not None:
        torch.save({"optimizer": optimizer.state_dict(), "step": step}, folder / "training_state.pt")


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------------

def train_tiny(config: TrainConfig, out_dir: str | Path, progress: bool = True, resume_from: str | Path | None = None,
               overwrite: bool = False, data_dir: str | Path | None = None, num_threads: int | None = None
               ) -> Trajectory:
    """Train a tiny GPT-NeoX under ``config`` and write its trajectory to ``out_dir``.

    Returns ``Trajectory.from_folder(out_dir)``. If ``out_dir`` already holds a finished run with
    the same config, returns it without training; a different run there raises :class:`TrainError`
    unless ``overwrite=True`` (which deletes its step-* folders and trajectory.json). An unfinished
    run with the same config continues from its last checkpoint if that has ``training_state.pt``
    (``save_optimizer=True``), and restarts otherwise.
    ``resume_from``: a checkpoint folder (of this or another run) to continue from at its step.
    ``data_dir``: where the tokenizer / token streams are cached (default ``out_dir/data``).
    ``num_threads``: torch CPU threads during training, restored afterwards. ``None`` = auto: 1
    thread when ``hidden_size <= 64`` (such models are too small to gain from threads, and on a
    loaded machine 2 threads were measured 25x slower than 1), torch's default otherwise; 0 =
    torch's default.
    Cost: ``steps`` forward+backward passes of [batch_size, seq_len] plus ``checkpoints`` x
    ``val_batches`` forward passes.
    """
    old_threads = torch.get_num_threads()
    if num_threads is None:
        num_threads = 1 if config.hidden_size <= 64 else 0
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        return _train(config, Path(out_dir), progress, resume_from, overwrite, data_dir)
    finally:
        torch.set_num_threads(old_threads)


def _train(config: TrainConfig, out: Path, progress: bool, resume_from, overwrite: bool, data_dir) -> Trajectory:
    out.mkdir(parents=True, exist_ok=True)
    tj_path = out / "trajectory.json"
    if tj_path.is_file() and resume_from is None:
        old = json.loads(tj_path.read_text())
        if old.get("config") == config.to_dict() and old.get("complete") and not overwrite:
            return Trajectory.from_folder(out)
        if not overwrite and old.get("config") != config.to_dict():
            raise TrainError(f"{out} already holds a run with a different config ({old.get('name')}); use another "
                             "output folder or overwrite=True (--force)")
        done = [r for r in old.get("checkpoints", []) if (out / r["path"] / "training_state.pt").is_file()]
        if not overwrite and done:  # an unfinished run that saved its optimizer: continue it
            return _train(config, out, progress, out / done[-1]["path"], overwrite, data_dir)
        for p in out.glob("step-*"):
            if p.is_dir():
                shutil.rmtree(p)
        tj_path.unlink()

    t_start = time.perf_counter()
    tok, train, val = prepare_data(config, out, data_dir)
    tok.save_pretrained(str(out / "tokenizer"))
    model = build_model(config, tok)
    optimizer = build_optimizer(model, config)
    n_params = sum(p.numel() for p in model.parameters())

    start, records, notes = 0, [], []
    if resume_from is not None:
        start, records, notes = _resume(Path(resume_from), model, optimizer, config, out)
    record = {
        "format": FORMAT, "name": config.run_name, "config": config.to_dict(), "n_params": n_params,
        "tokenizer": "tokenizer", "validation_set": "validation.safetensors",
        "data": {"source": "embedded[train]", "validation_source": "embedded[heldout]", "train_tokens": len(train),
                 "validation_hash": val.content_hash, "split": "document-level sha256 hash, 1 in 10 held out",
                 "tokens_per_step": config.tokens_per_step},
        "versions": {"torch": torch.__version__, "python": platform.python_version(),
                     "transformers": __import__("transformers").__version__},
        "notes": notes, "checkpoints": records, "complete": False,
    }
    run_loop(model, optimizer, train, val, tok, out, record, config, start=start,
             checkpoint_steps=config.checkpoint_steps, lr_fn=lambda step: lr_at(step, config), progress=progress,
             t_start=t_start)
    return Trajectory.from_folder(out)


def run_loop(model: nn.Module, optimizer: torch.optim.Optimizer, train: torch.Tensor, val: TokenSet, tok: Any,
             out: Path, record: dict, config: TrainConfig, start: int, checkpoint_steps: list[int], lr_fn,
             progress: bool = False, t_start: float | None = None, checkpoint_extra=None) -> None:
    """The training loop shared by :func:`train_tiny` and forks (:mod:`probes.forks`).

    Runs updates ``start + 1 .. config.steps``; update ``step`` uses LR ``lr_fn(step)`` on batch
    :func:`get_batch` ``(train, step, config)``. At each step of ``checkpoint_steps`` (those
    ``> start``) it evaluates the validation loss, writes ``out/step-NNNNNN/`` (with AdamW state when
    ``config.save_optimizer``), appends a record (step, tokens, lr, mean train loss since the last
    checkpoint, val loss, seconds since ``t_start``, plus ``checkpoint_extra(step)`` when given) to
    ``record["checkpoints"]`` and rewrites ``out/trajectory.json``; ``record["complete"]`` turns
    true at ``config.steps``.
    """
    from tqdm.auto import tqdm

    t_start = time.perf_counter() if t_start is None else t_start
    tj_path = out / "trajectory.json"
    ckpt_steps = {s for s in checkpoint_steps if s > start}
    records = record["checkpoints"]
    model.train()
    t_loop = time.perf_counter()
    losses: list[float] = []
    bar = tqdm(range(start + 1, config.steps + 1), desc=record["name"], disable=not progress, unit="step")
    for step in bar:
        lr = lr_fn(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = lm_loss(model, get_batch(train, step, config))
        if not math.isfinite(loss.item()):
            raise TrainError(f"training diverged at step {step} (loss {float(loss)}); lower the learning rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        if progress:
            bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{lr:.2e}", refresh=False)
        if step in ckpt_steps:
            val_loss = evaluate(model, val).loss
            model.train()
            folder = out / f"step-{step:06d}"
            save_checkpoint(folder, model, tok, optimizer if config.save_optimizer else None, step)
            records.append({"path": folder.name, "step": step, "tokens": step * config.tokens_per_step, "lr": lr,
                            "train_loss": sum(losses) / len(losses), "val_loss": val_loss,
                            "seconds": round(time.perf_counter() - t_start, 3),
                            **(checkpoint_extra(step) if checkpoint_extra else {})})
            losses = []
            record["seconds"] = round(time.perf_counter() - t_start, 3)
            record["steps_per_second"] = round((step - start) / (time.perf_counter() - t_loop), 3)
            record["complete"] = step == config.steps
            _write_json(tj_path, record)
    bar.close()


def _resume(ckpt: Path, model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig,
            out: Path) -> tuple[int, list, list]:
    """Load weights (+ AdamW state if saved) from ``ckpt``; return (start step, kept records, notes)."""
    from .checkpoints import CheckpointLoader

    ref = CheckpointRef.from_path(ckpt)
    if ref.step is None:
        raise TrainError(f"cannot tell the step of {ckpt}; name it step-<N>")
    loaded = CheckpointLoader(ref).load(ref)
    model.load_state_dict(loaded.state_dict())
    notes = [f"resumed from {ckpt} at step {ref.step}"]
    state_file = ckpt / "training_state.pt"
    if state_file.is_file():
        optimizer.load_state_dict(torch.load(state_file, map_location="cpu", weights_only=True)["optimizer"])
    else:
        notes.append("no training_state.pt: AdamW moments restarted from zero")
    records = []
    tj = ckpt.parent / "trajectory.json"
    if ckpt.parent.resolve() == out.resolve() and tj.is_file():
        records = [r for r in json.loads(tj.read_text()).get("checkpoints", []) if r["step"] <= ref.step]
    return ref.step, records, notes


# --------------------------------------------------------------------------------------------
# sweeps: the cartesian product of config values, one run folder each
# --------------------------------------------------------------------------------------------

SWEEP_FORMAT = "losslens-sweep/1"
#: short names accepted in sweep grids (``--sweep lr=...``) for TrainConfig fields
SWEEP_ALIASES = {"lr": "peak_lr", "wd": "weight_decay", "hidden": "hidden_size", "layers": "num_layers",
                 "heads": "num_heads", "vocab": "vocab_size", "batch": "batch_size", "seq": "seq_len"}
#: how each field appears in run names (``wsd-lr3e-3-wd0.5-s0``); other fields use their own name
_NAME_KEYS = {"peak_lr": "lr", "weight_decay": "wd", "hidden_size": "h", "num_layers": "layers", "num_heads": "heads",
              "vocab_size": "vocab", "batch_size": "batch", "seq_len": "seq", "min_lr_ratio": "minlr",
              "data_seed": "ds", "grad_clip": "clip"}


def format_value(v: Any) -> str:
    """Compact, file-name-safe number format for run names: 3e-3, 0.5, 1e-2, 600, true."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        if v != 0 and abs(v) < 0.1:
            mant, exp = f"{v:e}".split("e")
            mant = mant.rstrip("0").rstrip(".")
            return f"{mant}e{int(exp)}"
        return f"{v:g}"
    return str(v)


def _field_types() -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(TrainConfig)}


def _coerce(name: str, value: Any) -> Any:
    """``value`` (often a CLI string) converted to the type of TrainConfig field ``name``."""
    kind = _field_types()[name]
    if not isinstance(value, str):
        return value
    if value.lower() == "none" and "None" in kind:
        return None
    try:
        if kind.startswith("bool"):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
    except ValueError:
        raise TrainError(f"sweep value {value!r} for {name} is not of type {kind}") from None
    return value


def parse_sweep(specs: "list[str] | tuple[str, ...]") -> dict[str, list]:
    """``["lr=1e-3,3e-3", "wd=0.1,0.5"]`` -> ``{"peak_lr": [0.001, 0.003], "weight_decay": [0.1, 0.5]}``.
    Keys: TrainConfig field names or :data:`SWEEP_ALIASES`; values converted to the field's type."""
    grid: dict[str, list] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not values.strip():
            raise TrainError(f"bad --sweep {spec!r}: expected KEY=V1,V2,... (e.g. lr=1e-3,3e-3,1e-2)")
        grid[key.strip()] = [v.strip() for v in values.split(",") if v.strip()]
    return normalize_grid(grid)


def normalize_grid(grid: dict) -> dict[str, list]:
    """Resolve aliases, convert values to the fields' types, reject unknown/duplicate keys and values."""
    known = set(_field_types())
    out: dict[str, list] = {}
    for key, values in grid.items():
        name = SWEEP_ALIASES.get(key, key)
        if name not in known or name in ("seed", "name"):
            hint = "use seeds=/--seeds for seeds" if name == "seed" else \
                f"choose from {sorted(set(SWEEP_ALIASES) | known - {'seed', 'name'})}"
            raise TrainError(f"cannot sweep {key!r}: {hint}")
        if name in out:
            raise TrainError(f"{key!r} is swept twice")
        vals = [_coerce(name, v) for v in (values if isinstance(values, (list, tuple)) else [values])]
        if not vals:
            raise TrainError(f"sweep {key!r} has no values")
        if len({format_value(v) for v in vals}) != len(vals):
            raise TrainError(f"sweep {key!r} repeats a value: {vals}")
        out[name] = vals
    return out


def sweep_run_name(config: TrainConfig, keys: "list[str] | tuple[str, ...]" = ()) -> str:
    """``{schedule}-{key}{value}...-s{seed}`` with the swept ``keys`` in order, e.g.
    ``wsd-lr3e-3-wd0.5-s0`` (the schedule is always first, the seed always last)."""
    parts = [config.schedule]
    for k in keys:
        if k == "schedule":
            continue
        v = getattr(config, k)
        parts.append(format_value(v) if isinstance(v, str) else f"{_NAME_KEYS.get(k, k)}{format_value(v)}")
    parts.append(f"s{config.seed}")
    return "-".join(parts)


def plan_sweep(base_config: TrainConfig, grid: dict, seeds: "list[int] | tuple[int, ...] | None" = None
               ) -> list[TrainConfig]:
    """The configs of a sweep: the cartesian product of ``grid`` (values vary slowest for the first
    key) times ``seeds`` (innermost; default ``[base_config.seed]``), each named by
    :func:`sweep_run_name`."""
    import itertools

    from dataclasses import replace

    grid = normalize_grid(grid)
    seeds = [base_config.seed] if seeds is None else [int(s) for s in seeds]
    if len(set(seeds)) != len(seeds) or not seeds:
        raise TrainError(f"seeds must be distinct and non-empty, got {seeds}")
    keys = list(grid)
    configs = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        for seed in seeds:
            cfg = replace(base_config, **dict(zip(keys, combo)), seed=seed, name=None)
            configs.append(replace(cfg, name=sweep_run_name(cfg, keys)))
    return configs


def train_sweep(base_config: TrainConfig, grid: dict, out_dir: str | Path,
                seeds: "list[int] | tuple[int, ...] | None" = None, progress: bool = True, overwrite: bool = False,
                data_dir: str | Path | None = None, num_threads: int | None = None, on_run=None) -> list[Trajectory]:
    """Train every config of :func:`plan_sweep` into ``out_dir/<run name>/`` and index them in
    ``out_dir/sweep.json``.

    ``grid``: ``{field or alias: [values]}`` (e.g. ``{"lr": [1e-3, 3e-3], "wd": [0.1, 0.5]}``;
    strings are converted). Runs already finished with the same config are skipped (status
    ``cached``); a run that diverges is recorded as ``failed`` (with the error) and the sweep goes on.
    A folder holding a different run raises :class:`TrainError` before anything is trained
    (unless ``overwrite``). The runs share one tokenizer / token-stream cache (``data_dir``, default
    ``out_dir/data``). ``on_run(entry_dict)`` is called after each run. Returns the trajectories
    of the runs that finished, in plan order. Cost: the sum of the runs (sequential).
    ``sweep.json``: ``{"format", "base_config", "grid", "seeds", "runs": [{"name", "path", "params",
    "seed", "status" (pending|done|cached|failed), "error", "final_val_loss", "seconds"}]}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    grid = normalize_grid(grid)
    configs = plan_sweep(base_config, grid, seeds)
    data_dir = Path(data_dir) if data_dir is not None else out / "data"
    entries = []
    for cfg in configs:
        tj = out / cfg.name / "trajectory.json"
        old = json.loads(tj.read_text()) if tj.is_file() else None
        if old is not None and old.get("config") != cfg.to_dict() and not overwrite:
            raise TrainError(f"{tj.parent} already holds a run with a different config; use another --out or "
                             "overwrite=True (--force)")
        cached = bool(old and old.get("complete") and old.get("config") == cfg.to_dict() and not overwrite)
        entries.append({"name": cfg.name, "path": cfg.name, "params": {k: getattr(cfg, k) for k in grid},
                        "seed": cfg.seed, "status": "cached" if cached else "pending", "error": None,
                        "final_val_loss": (old["checkpoints"][-1]["val_loss"] if cached and old.get("checkpoints")
                                           else None), "seconds": old.get("seconds") if cached else None})
    index = {"format": SWEEP_FORMAT, "base_config": base_config.to_dict(), "grid": grid,
             "seeds": sorted({c.seed for c in configs}, key=[c.seed for c in configs].index), "runs": entries}
    _write_json(out / "sweep.json", index)
    trajectories = []
    for cfg, entry in zip(configs, entries):
        if entry["status"] != "cached":
            try:
                train_tiny(cfg, out / cfg.name, progress=progress, overwrite=overwrite, data_dir=data_dir,
                           num_threads=num_threads)
            except TrainError as exc:
                entry.update(status="failed", error=str(exc))
            else:
                entry["status"] = "done"
        if entry["status"] != "failed":
            traj = Trajectory.from_folder(out / cfg.name)
            trajectories.append(traj)
            entry["final_val_loss"] = traj[-1].meta.get("val_loss")
            entry["seconds"] = traj.meta.get("seconds")
        _write_json(out / "sweep.json", index)
        if on_run is not None:
            on_run(dict(entry))
    return trajectories
