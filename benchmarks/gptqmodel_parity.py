"""Parity of the ``gptq:B:gG:gptqmodel`` preset with GPTQModel itself: weights layer by layer, and ΔQ.

``python -m benchmarks.gptqmodel_parity [--models tiny pythia70m] [--bits 3 4] [--venv DIR] [--work DIR]``

GPTQModel needs torch ≥ 2.14.1, which the project's pin does not allow, so the benchmark builds its
own virtual environment (``--venv``, default /tmp/gptqmodel-venv: ``python3.11 -m venv``, then
``pip install torch==2.14.1`` and ``pip install gptqmodel==7.7.0``; skipped when it imports) and runs
GPTQModel there as a worker process (this file with ``--worker``; the worker imports only torch and
gptqmodel). Per model and bit width:

1. the model is saved as a Hugging Face folder (float32); calibration and evaluation blocks are
   disjoint windows of the embedded held-out corpus (``build_token_sets``; one sequence per block);
2. the worker quantizes it with ``QuantizeConfig(bits=B, group_size=G)`` (defaults otherwise, but
   ``offload_to_disk=False`` so that the packed modules stay readable),
   ``dtype=float32``, on CPU, calibration rows fed one per sample with an all-ones attention mask,
   and saves, per linear, GPTQModel's float32 result of ``GPTQ.quantize`` (the weight it writes into
   the module before packing; captured by wrapping that method), the damp it used, and the
   dequantized weight of the packed module (float16 scales) when packing succeeds;
3. here the preset ``gptq:B:gG:gptqmodel`` quantizes the same model on the same blocks; per linear:
   max|Δ|/max|W| and the share of entries that differ (> 1e-6·max|W|: a different grid point);
4. ΔQ = L_q/L − 1 on the evaluation blocks for the preset, GPTQModel's weights (loaded into the same
   float32 model, so only the algorithm differs) and the reference ``gptq:B:gG:sym:damp=0.05``; the
   paired difference preset − GPTQModel with its standard error over blocks.

Models: ``tiny`` — a GPT-NeoX trained by ``losslens train-tiny --tiny --hidden 128 --seq-len 128
--steps 150`` (its last checkpoint; trained into ``--work`` when ``--tiny-dir`` is not given); ``pythia70m`` — the
Pythia-70m shape (hidden 512, 6 layers, 8 heads, MLP 2048, vocab 50304), random init, seed 0.
Prints one JSON line per (model, bits) and writes them to ``--json``. Wall times are not
comparable across machines or under contention.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

TORCH_PIN = "torch==2.14.1"
GPTQMODEL_PIN = "gptqmodel==7.7.0"


# ----------------------------------------------------------------------------- worker (GPTQModel venv)
def worker(model_dir: str, calib_path: str, bits: int, group: int, out: str) -> None:
    """Quantize ``model_dir`` with GPTQModel; save per-linear weights (see the module docstring)."""
    import gptqmodel
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig
    from gptqmodel.quantization import gptq as gq

    captured: dict = {}
    original = gq.GPTQ.quantize

    def capture(self, *a, **k):
        res = original(self, *a, **k)
        named = getattr(self, "_named_module", None)
        key = getattr(named, "full_name", None) or self.name
        captured[key] = {
            "weight": res[0].detach().float().cpu().clone(),
            "damp": float(res[6]),
            "nsamples": int(res[7]),
        }
        return res

    gq.GPTQ.quantize = capture
    calib = torch.load(calib_path)
    data = [{"input_ids": row.unsqueeze(0), "attention_mask": torch.ones_like(row).unsqueeze(0)} for row in calib]
    # offload_to_disk off only keeps the packed modules' tensors in memory (readable afterwards); the
    # algorithm does not depend on it
    cfg = QuantizeConfig(bits=bits, group_size=group, offload_to_disk=False)
    t0 = time.perf_counter()
    model = GPTQModel.load(model_dir, cfg, device="cpu", dtype=torch.float32)
    packed, pack_error = {}, ""
    try:
        model.quantize(data, batch_size=1)
    except Exception as e:  # packing or a kernel may fail on CPU after every layer was quantized
        pack_error = f"{type(e).__name__}: {e}"
        if not captured:
            raise
    for name, mod in model.model.named_modules():
        if hasattr(mod, "dequantize_weight") and name in captured:
            try:
                w = mod.dequantize_weight().float()  # [in, out]
                if hasattr(mod, "qzero_format") and mod.qzero_format() == 1:
                    # right after packing the module holds GPTQ-v1 zero points (z − 1), which GPTQModel converts
                    # to v2 only when a checkpoint is loaded; this dequantizer reads v2: one scale step too high
                    w = w - mod.scales.float()[mod.g_idx.long()]
                packed[name] = w.T.cpu().clone()
            except Exception as e:  # noqa: BLE001 - recorded in the row; the float32 weights are the comparison
                pack_error = pack_error or f"dequantize_weight: {type(e).__name__}: {e}"
    torch.save(
        {
            "layers": captured,
            "packed": packed,
            "pack_error": pack_error,
            "seconds": time.perf_counter() - t0,
            "gptqmodel": str(gptqmodel.__version__),
            "torch": str(torch.__version__),
            "config": repr(cfg),
        },
        out,
    )


# ----------------------------------------------------------------------------- the venv
def ensure_venv(venv: Path) -> Path:
    """The GPTQModel venv's python, built when it does not import gptqmodel yet (minutes, ~6 GB)."""
    py = venv / "bin" / "python"
    check = [str(py), "-c", "import gptqmodel, torch; print(gptqmodel.__version__, torch.__version__)"]
    if py.exists() and subprocess.run(check, capture_output=True, check=False).returncode == 0:
        return py
    if not py.exists():
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", TORCH_PIN], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", GPTQMODEL_PIN], check=True)
    res = subprocess.run(check, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"GPTQModel does not import in {venv}: {res.stderr.strip()[-2000:]}")
    return py


# ----------------------------------------------------------------------------- models and data
def tiny_dir(work: Path, given: str | None) -> Path:
    """The last checkpoint of a tiny trained GPT-NeoX (trained into ``work`` when none is given)."""
    root = Path(given) if given else work / "tiny"
    if not given and not any(root.glob("step-*")):
        cmd = [
            sys.executable,
            "-m",
            "losslens.study.sweep",
            "train-tiny",
            "--tiny",
            "--hidden",
            "128",
            "--steps",
            "150",
            "--seq-len",
            "128",
            "--out",
            str(root),
            "-q",
        ]
        subprocess.run(cmd, check=True)
    steps = sorted(root.glob("step-*"))
    return steps[-1] if steps else root


def pythia70m_dir(work: Path, tokenizer_from: Path) -> Path:
    """The Pythia-70m-shape random model (with the tiny model's tokenizer files, which GPTQModel loads)."""
    import shutil

    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    out = work / "pythia70m-random"
    if not (out / "config.json").exists():
        cfg = GPTNeoXConfig(
            vocab_size=50304,
            hidden_size=512,
            num_hidden_layers=6,
            num_attention_heads=8,
            intermediate_size=2048,
            rotary_pct=0.25,
            max_position_embeddings=2048,
            use_parallel_residual=True,
            tie_word_embeddings=False,
            use_cache=False,
        )
        torch.manual_seed(0)
        GPTNeoXForCausalLM(cfg).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizer_from / f).exists():
            shutil.copy(tokenizer_from / f, out / f)
    return out


def blocks(tokenizer_dir: Path, n_cal: int, n_eval: int, seq: int):
    """(calibration [n_cal, seq], evaluation [n_eval, seq]) LongTensors, disjoint corpus windows."""
    from losslens.lm.data.corpus import TextSource
    from losslens.lm.data.token_sets import build_token_sets

    sets = build_token_sets(
        tokenizer_dir,
        TextSource.embedded(split="heldout"),
        {"calibration": (n_cal, 1, seq), "eval": (n_eval, 1, seq)},
        seed=0,
    )
    return sets["calibration"].tokens.reshape(n_cal, seq), sets["eval"].tokens.reshape(n_eval, seq)


# ----------------------------------------------------------------------------- comparison
def block_losses(model, ev) -> list[float]:
    """Mean next-token CE (nats) of each evaluation sequence."""
    import torch
    import torch.nn.functional as F

    out = []
    with torch.no_grad():
        for row in ev:
            logits = model(input_ids=row.unsqueeze(0)).logits[0, :-1].float()
            out.append(float(F.cross_entropy(logits, row[1:])))
    return out


def write_weights(model, weights: dict) -> None:
    import torch

    mods = dict(model.named_modules())
    with torch.no_grad():
        for name, w in weights.items():
            mods[name].weight.copy_(w.reshape(mods[name].weight.shape).to(mods[name].weight.dtype))


def compare_layers(preset: dict, peer: dict, fp: dict) -> list[dict]:
    rows = []
    for name, p in preset.items():
        g = peer.get(name)
        if g is None:
            rows.append({"layer": name, "missing_in_gptqmodel": True})
            continue
        w = fp[name]
        scale = float(w.abs().max())
        d = (p - g).abs()
        rows.append(
            {
                "layer": name,
                "max_abs_diff_rel": float(d.max()) / scale,
                "differing_share": float((d > 1e-6 * scale).float().mean()),
                "diff_over_quant_error": float((p - g).norm() / (g - w).norm().clamp_min(1e-30)),
            }
        )
    return rows


def paired(a: list[float], b: list[float], fp_mean: float) -> tuple[float, float]:
    """Mean and standard error over blocks of (a_i − b_i)/L_fp."""
    diffs = [(x - y) / fp_mean for x, y in zip(a, b)]
    n = len(diffs)
    m = sum(diffs) / n
    var = sum((d - m) ** 2 for d in diffs) / (n - 1) if n > 1 else float("nan")
    return m, math.sqrt(var / n)


def _worker_env() -> dict:
    """GPTQModel 7.7.0 sizes its CPU pool as ⌈cores/2⌉ but asks for 2 model-loader workers: on a
    2-core machine that is 1 < 2 and ``GPTQModel.load`` raises; GPTQMODEL_CPU_WORKERS lifts it."""
    env = dict(os.environ)
    env.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, (os.cpu_count() or 1 + 1) // 2)))
    return env


def run_one(label: str, model_dir: Path, py: Path, bits: int, group: int, cal, ev, work: Path, timeout: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from losslens.lm.quant import quantize

    calib_path = work / f"{label}-calib.pt"
    torch.save(cal, calib_path)
    out = work / f"{label}-b{bits}-gptqmodel.pt"
    t0 = time.perf_counter()
    res = subprocess.run(
        [str(py), __file__, "--worker", str(model_dir), str(calib_path), str(bits), str(group), str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_worker_env(),
        check=False,
    )
    row = {
        "model": label,
        "bits": bits,
        "group": group,
        "n_calibration": int(cal.shape[0]),
        "n_eval": int(ev.shape[0]),
        "seq": int(cal.shape[1]),
        "gptqmodel_seconds": time.perf_counter() - t0,
    }
    if res.returncode != 0:
        row["gptqmodel_error"] = (res.stderr or res.stdout).strip()[-3000:]
        return row
    peer = torch.load(out, weights_only=False)  # our own file: tensors, strings and numbers
    row.update(gptqmodel=peer["gptqmodel"], gptqmodel_torch=peer["torch"], pack_error=peer["pack_error"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    fp_losses = block_losses(model, ev)
    fp_mean = sum(fp_losses) / len(fp_losses)
    cal_batches = [r.unsqueeze(0) for r in cal]
    preset = quantize(model, f"gptq:{bits}:g{group}:gptqmodel", calibration=cal_batches)
    mods = dict(preset.model.named_modules())
    fp_mods = dict(model.named_modules())
    names = [r.name for r in preset.report]
    p_w = {n: mods[n].weight.detach().clone() for n in names}
    fp_w = {n: fp_mods[n].weight.detach().clone() for n in names}
    g_w = {n: v["weight"] for n, v in peer["layers"].items()}
    row["layers"] = compare_layers(p_w, g_w, fp_w)
    row["damp_preset"] = sorted({r.damping for r in preset.report})
    row["damp_gptqmodel"] = sorted({v["damp"] for v in peer["layers"].values()})
    if peer["packed"]:
        # the stored model (float16 scales) against the float32 result of the algorithm
        row["packed_vs_float_max_rel"] = max(
            float((peer["packed"][n] - g_w[n]).abs().max() / fp_w[n].abs().max()) for n in peer["packed"] if n in fp_w
        )
    losses = {"preset": block_losses(preset.model, ev)}
    write_weights(model, g_w)
    losses["gptqmodel"] = block_losses(model, ev)
    write_weights(model, fp_w)
    ref = quantize(model, f"gptq:{bits}:g{group}:sym:damp=0.05", calibration=cal_batches)
    losses["reference"] = block_losses(ref.model, ev)
    for k, v in losses.items():
        row[f"dq_{k}"] = sum(v) / len(v) / fp_mean - 1.0
    row["dq_preset_minus_gptqmodel"], row["dq_paired_se"] = paired(losses["preset"], losses["gptqmodel"], fp_mean)
    row["dq_reference_minus_gptqmodel"], row["dq_reference_se"] = paired(
        losses["reference"], losses["gptqmodel"], fp_mean
    )
    row["max_abs_diff_rel"] = max(r.get("max_abs_diff_rel", float("inf")) for r in row["layers"])
    row["max_differing_share"] = max(r.get("differing_share", 1.0) for r in row["layers"])
    return row


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "pythia70m"], choices=["tiny", "pythia70m"])
    ap.add_argument("--bits", nargs="+", type=int, default=[3, 4])
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--venv", default="/tmp/gptqmodel-venv")
    ap.add_argument("--work", default="/tmp/gptqmodel-parity")
    ap.add_argument("--tiny-dir", default=None, help="a trained tiny checkpoint (or trajectory) folder")
    ap.add_argument("--n-cal", type=int, default=32)
    ap.add_argument("--n-eval", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per GPTQModel run")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    py = ensure_venv(Path(a.venv))
    tdir = tiny_dir(work, a.tiny_dir)
    tokenizer_dir = tdir if (tdir / "tokenizer.json").exists() else tdir.parent / "tokenizer"
    ctx = json.loads((tdir / "config.json").read_text()).get("max_position_embeddings", a.seq)
    cal, ev = blocks(tokenizer_dir, a.n_cal, a.n_eval, min(a.seq, ctx))  # GPTQModel trims rows to the context
    rows = []
    for label in a.models:
        mdir = tdir if label == "tiny" else pythia70m_dir(work, tokenizer_dir)
        for bits in a.bits:
            row = run_one(label, mdir, py, bits, a.group, cal, ev, work, a.timeout)
            print(json.dumps({k: v for k, v in row.items() if k != "layers"}), flush=True)
            rows.append(row)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        main()
