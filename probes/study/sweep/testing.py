"""Synthetic tiny trajectories for tests and smoke runs of sweeps (seconds, no training, no tokenizer).

:func:`tiny_trajectory` writes ``n`` HF Llama checkpoints (hidden 32, 2 layers, vocab 96) whose
weights drift from a random init like a short training run would (each step adds a seeded
perturbation and slowly grows the weight norm), a ``trajectory.json`` with step / tokens / LR
(warmup-stable-decay), and random-token :class:`TokenSet` files for eval / calibration / curvature.
:func:`tiny_plan_toml` writes a plan file pointing at those token sets, so ``losslens sweep``
needs no tokenizer. Real studies use :mod:`losslens.lm.train.tiny` instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 96
SEQ = 16


def tiny_config(hidden: int = 32, layers: int = 2, heads: int = 2, vocab: int = VOCAB, context: int = 64):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=context,
        tie_word_embeddings=False,
        attention_dropout=0.0,
    )


def wsd_lr(step: int, total: int, peak: float = 1e-3, warmup: float = 0.1, decay: float = 0.3) -> float:
    """Warmup-stable-decay learning rate at ``step`` of ``total``."""
    w, d = int(warmup * total), int((1 - decay) * total)
    if step < w:
        return peak * (step + 1) / w
    if step < d:
        return peak
    return peak * max(0.0, (total - step) / max(1, total - d))


def tiny_trajectory(
    folder: str | Path, n: int = 4, seed: int = 0, step_every: int = 100, hidden: int = 32, layers: int = 2
) -> Path:
    """Write ``n`` checkpoints ``step-XXXXXX/`` plus ``trajectory.json`` and ``data/*.safetensors``
    into ``folder``; return the folder. Deterministic for (n, seed, step_every, hidden, layers)."""
    from transformers import LlamaForCausalLM

    from losslens.lm.core.tokenset import TokenSet

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(hidden, layers)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    total = n * step_every
    entries = []
    for i in range(n):
        step = (i + 1) * step_every
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.02).add_(0.02 * torch.randn(p.shape, generator=g))
        name = f"step-{step:06d}"
        model.save_pretrained(folder / name, safe_serialization=True)
        entries.append({"path": name, "step": step, "tokens": step * 64, "lr": wsd_lr(step - 1, total)})
    (folder / "trajectory.json").write_text(json.dumps({"name": f"tiny-{seed}", "checkpoints": entries}, indent=1))
    gd = torch.Generator().manual_seed(seed + 2)
    data = folder / "data"
    for name, nb in (("eval", 2), ("calibration", 2), ("curvature", 1)):
        TokenSet(torch.randint(0, VOCAB, (nb, 2, SEQ), generator=gd), name).save(data / f"{name}.safetensors")
    return folder


def tiny_token_sets(folder: str | Path) -> dict:
    """The token sets written by :func:`tiny_trajectory`."""
    from losslens.lm.core.tokenset import TokenSet

    return {n: TokenSet.load(Path(folder) / "data" / f"{n}.safetensors") for n in ("eval", "calibration", "curvature")}


def tiny_plan_toml(path: str | Path, folder: str | Path, probes: str | None = None, name: str = "tiny") -> Path:
    """A plan file for a :func:`tiny_trajectory` (its token-set files); ``probes`` = TOML body of
    the ``[probes]`` table (default: a cheap set of every probe kind)."""
    folder = Path(folder).resolve()
    body = (
        probes
        if probes is not None
        else (
            'loss = true\nquant = ["rtn:4", "int8", "gptq:3"]\ntrace = { method = "hutch++", num_matvecs = 6 }\n'
            'eigen = { k = 1, method = "power", max_iter = 8 }\ndirectional = ["rtn:4"]\nkurtosis = true\n'
        )
    )
    text = (
        f'name = "{name}"\nseed = 0\n[data]\neval = [2, 2, {SEQ}]\ncalibration = [2, 2, {SEQ}]\n'
        f"curvature = [1, 2, {SEQ}]\n"
        f'files = {{ eval = "{folder}/data/eval.safetensors", calibration = "{folder}/data/calibration.safetensors", '
        f'curvature = "{folder}/data/curvature.safetensors" }}\n[probes]\n{body}'
    )
    path = Path(path)
    path.write_text(text)
    return path


__all__ = ["tiny_trajectory", "tiny_token_sets", "tiny_plan_toml", "tiny_config", "wsd_lr"]
