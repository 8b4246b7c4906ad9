"""GGUF files (llama.cpp) as checkpoints: dequantized once into an ordinary checkpoint folder.

A ``.gguf`` file is loaded through transformers' GGUF support (``from_pretrained(folder,
gguf_file=name)``; needs the optional ``gguf`` package: ``pip install losslens[gguf]``), which
dequantizes every tensor (Q4_0 ... Q8_0, k-quants, F16/BF16) to float32 and maps llama.cpp's names
and layouts back to the Hugging Face model of the file's architecture (llama, mistral, qwen2/3,
phi3, gemma2/3, gpt2, falcon, bloom, stablelm, starcoder2, ...; transformers'
``GGUF_SUPPORTED_ARCHITECTURES``; GPT-NeoX/Pythia is not among them). The model and the tokenizer
stored in the file are saved with ``save_pretrained`` into a cache folder
``$LOSSLENS_CACHE_DIR/gguf/<key>/<file stem>/`` (default ``~/.cache/losslens``; key = SHA-256 of the
file's resolved path, size and mtime), so every command then reads it like any checkpoint folder:
config.json + model.safetensors (float32) + tokenizer files. The folder is written once (into a
temporary sibling, then renamed) and reused while the file is unchanged.

Cost: one dequantizing load of the file (seconds for small models) and its float32 size on disk.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from losslens.lm.checkpoints.errors import CheckpointError

__all__ = ["dequantized", "gguf_cache_root", "gguf_checkpoint_folder", "gguf_in_folder", "is_gguf"]

SUFFIX = ".gguf"


def is_gguf(path: str | Path) -> bool:
    """True for an existing file whose name ends in ``.gguf``."""
    p = Path(path)
    return p.suffix.lower() == SUFFIX and p.is_file()


def dequantized(path: Path) -> Path:
    """``path``'s dequantized checkpoint folder when it is a ``.gguf`` file (:func:`gguf_checkpoint_folder`);
    any other path as it is."""
    return gguf_checkpoint_folder(path) if is_gguf(path) else path


def gguf_cache_root() -> Path:
    """``$LOSSLENS_CACHE_DIR/gguf`` (default ``~/.cache/losslens/gguf``); ``off`` is not allowed here."""
    env = os.environ.get("LOSSLENS_CACHE_DIR")
    if env and env.lower() == "off":
        raise CheckpointError(
            "a .gguf checkpoint is dequantized into $LOSSLENS_CACHE_DIR/gguf, but "
            "LOSSLENS_CACHE_DIR=off; set it to a writable folder"
        )
    return Path(env).expanduser() / "gguf" if env else Path.home() / ".cache" / "losslens" / "gguf"


def gguf_in_folder(folder: str | Path) -> Path | None:
    """The one ``.gguf`` file of a folder that has no config.json (a GGUF hub snapshot), else None.

    Raises :class:`CheckpointError` when several ``.gguf`` files are there (name the file instead)."""
    folder = Path(folder)
    if not folder.is_dir() or (folder / "config.json").is_file():
        return None
    found = sorted(p for p in folder.iterdir() if p.suffix.lower() == SUFFIX)
    if len(found) > 1:
        raise CheckpointError(
            f"{folder} holds several GGUF files ({', '.join(p.name for p in found)}); pass the path of the one to use"
        )
    return found[0] if found else None


def _key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]


def gguf_checkpoint_folder(path: str | Path) -> Path:
    """The dequantized checkpoint folder of the GGUF file ``path`` (written on first use; see the module docstring).

    Raises:
        CheckpointError: the ``gguf`` package is missing, transformers cannot read the file (its
            architecture is unsupported, or it is not a GGUF file).
    """
    path = Path(path).expanduser()
    if not is_gguf(path):
        raise CheckpointError(f"{path} is not a .gguf file")
    out = gguf_cache_root() / _key(path) / path.stem
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise CheckpointError(
            f"{path.name}: loading a GGUF checkpoint needs the optional package 'gguf' (pip install 'losslens[gguf]')"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:  # unsupported architecture, truncated file, not GGUF ...
        from transformers.modeling_gguf_pytorch_utils import (
            GGUF_SUPPORTED_ARCHITECTURES,
        )

        raise CheckpointError(
            f"transformers cannot load the GGUF file {path}: {str(exc).strip().splitlines()[0]} "
            f"(architectures it reads: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
        ) from exc
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # transformers marks the model as GGUF-"quantized" and refuses to save it; its weights are plain
    # dequantized float tensors, so drop the marker and save it as the ordinary model it now is
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(tmp))
    try:
        AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(str(tmp))
    except Exception as exc:  # a GGUF without a tokenizer still loads; token sets then need --tokenizer
        (tmp / "NO_TOKENIZER.txt").write_text(f"transformers could not read a tokenizer from {path}: {exc}\n")
    (tmp / "source.txt").write_text(f"dequantized from {path.resolve()} by losslens.lm.checkpoints.gguf\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
