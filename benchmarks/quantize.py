"""Native GPTQ wall time (vs GPTQModel when installed), seconds per layer, and memory.

``python -m benchmarks.quantize [--quick] [--json PATH]``

Rows (``run(quick) -> list[dict]``):

- ``tiny``: a randomly initialised 2-layer GPT-NeoX (hidden 64, MLP 256, vocab 512, float32),
  calibration 8 × 4 × 64 random tokens, ``gptq:4:g32``, end-to-end wall time of
  :func:`losslens.lm.quant.quantize` (capture, per-block forwards, GPTQ, copy) — and the same through
  the ``gptqmodel`` backend when GPTQModel is installed (``ratio`` = GPTQModel s ÷ native s; the
  goal is ≥ 3). Without GPTQModel the peer row says ``not installed``.
- ``neox-10M``: a randomly initialised GPT-NeoX with ~10M parameters (hidden 256, 8 layers,
  MLP 1024, vocab 8192), calibration 16 × 8 × 128 tokens (quick: 4 × 8 × 128), for ``gptq:4:g128``
  and ``rtn:4:g128``: total wall, seconds per quantized layer (end to end ÷ layers, and the GPTQ
  algorithm alone from the layer reports), and the peak resident-memory increase during an in-place
  quantization next to the model size and the size of one block boundary's calibration activations
  (the driver keeps one such set plus one H per input group; it never holds the whole model's
  activations).

Timings depend on the machine and on the torch intra-op threads (reported; ``--threads``; quick
mode uses 1).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time

import torch

from losslens.lm.core.threads import torch_threads


def _neox(hidden, layers, inter, vocab, ctx, seed=0):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=inter,
        max_position_embeddings=ctx,
        use_cache=False,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return GPTNeoXForCausalLM(cfg).eval()


class _PeakRSS:
    """Samples this process's resident set size every few ms (Linux /proc; None elsewhere)."""

    def __init__(self, interval=0.003):
        self.interval, self.peak, self.base, self._stop = interval, None, None, threading.Event()

    @staticmethod
    def rss():
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            return None

    def __enter__(self):
        self.base = self.peak = self.rss()
        if self.base is not None:
            self._t = threading.Thread(target=self._loop, daemon=True)
            self._t.start()
        return self

    def _loop(self):
        while not self._stop.wait(self.interval):
            r = self.rss()
            if r is not None and r > self.peak:
                self.peak = r

    def __exit__(self, *exc):
        self._stop.set()
        if self.base is not None:
            self._t.join()
            r = self.rss()
            self.peak = max(self.peak, r or 0)

    @property
    def increase_mb(self):
        return None if self.base is None else (self.peak - self.base) / 2**20


def _tiny_rows() -> list[dict]:
    from losslens.lm.quant import quantize
    from losslens.lm.quant.backends import available

    model = _neox(64, 2, 256, 512, 128)
    calib = torch.randint(0, 512, (8, 4, 64), generator=torch.Generator().manual_seed(1))
    quantize(model, "gptq:4:g32", calibration=calib[:2])  # warm-up (imports, allocator)
    t0 = time.perf_counter()
    qm = quantize(model, "gptq:4:g32", calibration=calib)
    native = time.perf_counter() - t0
    rows = [
        {
            "case": "tiny",
            "impl": "native",
            "spec": "gptq:4:g32",
            "seconds": native,
            "layers": len(qm.report),
            "calib_tokens": calib.numel(),
            "status": "ok",
        }
    ]
    if available()["gptqmodel"]:
        try:
            t0 = time.perf_counter()
            quantize(model, "gptqmodel:4:g32", calibration=calib)
            peer = time.perf_counter() - t0
            rows.append(
                {
                    "case": "tiny",
                    "impl": "gptqmodel",
                    "spec": "gptqmodel:4:g32",
                    "seconds": peer,
                    "layers": len(qm.report),
                    "calib_tokens": calib.numel(),
                    "status": "ok",
                    "ratio": peer / native,
                }
            )
        except Exception as e:  # pragma: no cover - optional peer
            rows.append({"case": "tiny", "impl": "gptqmodel", "status": f"failed: {type(e).__name__}: {e}"[:200]})
    else:
        rows.append({"case": "tiny", "impl": "gptqmodel", "status": "not installed (needs torch>=2.14.1; see README)"})
    return rows


def _neox10m_rows(quick: bool) -> list[dict]:
    from losslens.lm.quant import quantize

    model = _neox(256, 8, 1024, 8192, 128)
    n_params = sum(p.numel() for p in model.parameters())
    nb = 4 if quick else 16
    calib = torch.randint(0, 8192, (nb, 8, 128), generator=torch.Generator().manual_seed(2))
    act_mb = nb * 8 * 128 * 256 * 4 / 2**20
    model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    rows = []
    for spec in ("gptq:4:g128", "rtn:4:g128"):
        target = _neox(256, 8, 1024, 8192, 128)  # fresh copy, quantized in place (no deep copy in the peak)
        with _PeakRSS() as mem:
            t0 = time.perf_counter()
            qm = quantize(target, spec, calibration=calib, inplace=True)
            wall = time.perf_counter() - t0
        algo = sum(r.seconds for r in qm.report)
        rows.append(
            {
                "case": "neox-10M",
                "impl": "native",
                "spec": spec,
                "params": n_params,
                "layers": len(qm.report),
                "calib_tokens": calib.numel(),
                "seconds": wall,
                "s_per_layer": wall / len(qm.report),
                "algo_s_per_layer": algo / len(qm.report),
                "peak_rss_increase_mb": mem.increase_mb,
                "model_mb": model_mb,
                "block_activations_mb": act_mb,
                "status": "ok",
            }
        )
        del target, qm
    return rows


def run(quick: bool = False, threads: int | None = None) -> list[dict]:
    """All benchmark rows (see the module docstring). Quick mode: < 60 s on 2 CPU cores.

    ``threads``: torch intra-op threads for the run (restored afterwards); default: torch's
    default, except 1 in quick mode (on a small shared machine OpenMP barriers, not flops,
    dominate these tiny matrices — 2 threads under load measured ~30× slower than 1).
    """
    n = threads if threads is not None else (1 if quick else torch.get_num_threads())
    with torch_threads(n):
        rows = _tiny_rows() + _neox10m_rows(quick)
    for r in rows:
        r.setdefault("threads", n)
        r.setdefault("device", "cpu")
        r.setdefault("machine", platform.machine())
    return rows


def format_table(rows: list[dict]) -> str:
    cols = [
        "case",
        "impl",
        "spec",
        "seconds",
        "s_per_layer",
        "algo_s_per_layer",
        "ratio",
        "peak_rss_increase_mb",
        "model_mb",
        "block_activations_mb",
        "status",
    ]
    lines = [" | ".join(cols)]
    for r in rows:
        lines.append(" | ".join(f"{r[c]:.3g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small settings (< 60 s)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's; 1 with --quick)"
    )
    args = parser.parse_args(argv)
    rows = run(quick=args.quick, threads=args.threads)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
