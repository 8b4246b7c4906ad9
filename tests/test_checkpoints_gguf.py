"""GGUF files as checkpoints: a tiny llama written by the tests (tests/gguf_files.py), loaded dequantized
through transformers' GGUF support, with its tokenizer, through quantize, sharpness and accuracy.

Skipped only when the ``gguf`` package is absent.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("gguf")

from losslens.lm.checkpoints import CheckpointError, CheckpointLoader, open_checkpoint
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.quant import quantize
from losslens.lm.quant.ggml import gguf_quantize
from tests.gguf_files import train_tiny_llama, write_gguf


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("LOSSLENS_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    model, tok = train_tiny_llama()
    path = write_gguf(tmp_path_factory.mktemp("files") / "tiny-step-20.gguf", model, tok)
    yield model, tok, path
    mp.undo()


def test_loads_dequantized_with_its_tokenizer(written):
    from losslens.lm.data.tokenizers import load_tokenizer

    model, tok, path = written
    traj, ref = open_checkpoint(path)
    assert ref.step == 20
    loaded = CheckpointLoader(traj).load(ref)
    for name, p in model.named_parameters():
        q = dict(loaded.named_parameters())[name]
        if ".layers." in name and p.ndim == 2:  # stored as Q8_0: exactly our gguf:Q8_0 fake quantization
            assert torch.equal(q, gguf_quantize(p.detach(), "Q8_0")[0]), name
        else:
            assert torch.equal(q, p.detach()), name
    ids = torch.tensor(tok.encode("def quantize(model, spec):\n    return spec")[:24])[None]
    assert load_tokenizer(ref).encode("def f(x): return x + 1") == tok.encode("def f(x): return x + 1")
    with torch.no_grad():
        want = lm_loss(quantize(model, "gguf:Q8_0").model, ids).item()
        assert lm_loss(loaded, ids).item() == pytest.approx(want, rel=1e-6)
    folder = traj[ref.label].location
    stamp = (torch.tensor(0), __import__("os").stat(f"{folder}/model.safetensors").st_mtime_ns)
    assert open_checkpoint(path)[1].location == folder  # the cache is reused while the file is unchanged
    assert __import__("os").stat(f"{folder}/model.safetensors").st_mtime_ns == stamp[1]


def test_cli_quantize_sharpness_accuracy(written):
    from typer.testing import CliRunner

    from losslens.cli.app import app

    _, _, path = written
    run = CliRunner()
    q = run.invoke(
        app,
        [
            "quantize",
            str(path),
            "--spec",
            "gguf:Q4_K",
            "--spec",
            "mxfp4",
            "--spec",
            "had+rtn:4:g32",
            "--quick",
            "--json",
        ],
    )
    assert q.exit_code == 0, q.output
    rows = [json.loads(line) for line in q.stdout.splitlines() if line.startswith("{")]
    assert [r["spec"] for r in rows] == ["gguf:Q4_K", "mxfp4", "had+rtn:4:g32"]
    assert all(r["fp_loss"] > 0 and r["q_loss"] > 0 for r in rows)
    s = run.invoke(app, ["sharpness", str(path), "--quick", "--num-matvecs", "4", "--max-iter", "5", "--json"])
    assert s.exit_code == 0, s.output
    a = run.invoke(
        app,
        [
            "accuracy",
            str(path),
            "--tasks",
            "embedded",
            "--spec",
            "gguf:Q4_0",
            "--limit",
            "6",
            "--n-boot",
            "20",
            "--json",
        ],
    )
    if a.exit_code != 0 and "lm_eval" in a.output:
        pytest.skip("the accuracy command needs lm-eval")
    assert a.exit_code == 0, a.output


def test_hub_snapshot_with_a_gguf_file(written, tmp_path):
    from tests.hub_cache import add_revision

    _, _, path = written
    src = tmp_path / "src"
    src.mkdir()
    (src / path.name).write_bytes(path.read_bytes())
    cache = tmp_path / "hub"
    add_revision(cache, "org/tiny-gguf", "main", src)
    traj, ref = open_checkpoint("hf:org/tiny-gguf@main", cache_dir=cache)
    model = CheckpointLoader(traj).load(ref)
    assert type(model).__name__ == "LlamaForCausalLM"
    (src / "second.gguf").write_bytes(path.read_bytes())
    add_revision(cache, "org/two-gguf", "main", src)
    with pytest.raises(CheckpointError, match="several GGUF files"):
        t2, r2 = open_checkpoint("hf:org/two-gguf@main", cache_dir=cache)
        CheckpointLoader(t2).load(r2)


def test_unsupported_architecture_is_a_clear_error(tmp_path, monkeypatch):
    import gguf
    import numpy as np

    monkeypatch.setenv("LOSSLENS_CACHE_DIR", str(tmp_path / "cache"))
    w = gguf.GGUFWriter(str(tmp_path / "neox.gguf"), "gptneox")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="architectures it reads: .*llama"):
        open_checkpoint(tmp_path / "neox.gguf")
