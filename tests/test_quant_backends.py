"""Optional backends (bitsandbytes, GPTQModel): tested when installed, clear errors when not."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

from losslens.lm.quant import BackendUnavailable, int8_quantize, quantize
from losslens.lm.quant.backends import available

HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None
HAS_GPTQMODEL = importlib.util.find_spec("gptqmodel") is not None


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=32,
        use_cache=False,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_available_follows_what_is_importable(tmp_path, monkeypatch):
    """available() tracks the import system, not a cached answer: hide an installed backend and it
    reports False (and quantize refuses with the install hint); put a package of that name on the
    path and it reports True."""
    import sys

    assert set(available()) == {"bitsandbytes", "gptqmodel"}
    real = importlib.util.find_spec

    def hide_bnb(name, *args, **kwargs):
        return None if name == "bitsandbytes" else real(name, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(importlib.util, "find_spec", hide_bnb)
        assert available()["bitsandbytes"] is False
        with pytest.raises(BackendUnavailable, match="pip install bitsandbytes"):
            quantize(tiny_llama(), "bnb-nf4")
    if not HAS_GPTQMODEL:
        assert available()["gptqmodel"] is False
        (tmp_path / "gptqmodel").mkdir()
        (tmp_path / "gptqmodel" / "__init__.py").write_text("")
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "gptqmodel", raising=False)
        importlib.invalidate_caches()
        assert available()["gptqmodel"] is True


@pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes not installed")
def test_bnb_nf4_and_int8():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import bitsandbytes.functional as bf
    model = tiny_llama()
    orig = {n: p.detach().clone() for n, p in model.named_parameters()}
    q4 = quantize(model, "bnb-nf4")
    mods = dict(q4.model.named_modules())
    assert len(q4.report) == 7
    for r in q4.report:
        W = orig[r.name + ".weight"]
        qt, st = bf.quantize_4bit(W, blocksize=64, quant_type="nf4")
        torch.testing.assert_close(mods[r.name].weight, bf.dequantize_4bit(qt, st))
        assert 0.02 < r.rel_weight_error < 0.2
        # at most 16 levels (times one absmax) per block of 64
        blk = mods[r.name].weight.detach().reshape(-1, 64)[0]
        assert len(torch.unique(blk)) <= 16
    q8 = quantize(model, "bnb-int8")
    for r in q8.report:
        W = orig[r.name + ".weight"]
        got = dict(q8.model.named_modules())[r.name].weight.detach()
        torch.testing.assert_close(got, int8_quantize(W), rtol=1e-5, atol=1e-6)
    assert all(torch.equal(p, orig[n]) for n, p in model.named_parameters())
    assert str(quantize(model, "bnb-nf4:g128").spec) == "bnb-nf4:g128"


@pytest.mark.skipif(HAS_BNB, reason="bitsandbytes is installed")
def test_bnb_missing_is_clear():
    with pytest.raises(BackendUnavailable, match="pip install bitsandbytes"):
        quantize(tiny_llama(), "bnb-nf4")


@pytest.mark.skipif(HAS_GPTQMODEL, reason="gptqmodel is installed")
def test_gptqmodel_missing_is_clear():
    calib = torch.randint(0, 50, (4, 4, 16))
    with pytest.raises(BackendUnavailable, match="pip install gptqmodel"):
        quantize(tiny_llama(), "gptqmodel:4:g32", calibration=calib)


@pytest.mark.skipif(not HAS_GPTQMODEL, reason="gptqmodel not installed")
def test_gptqmodel_close_to_native():  # pragma: no cover - optional
    model = tiny_llama()
    calib = torch.randint(0, 50, (4, 4, 16))
    ours = quantize(model, "gptq:4:g32:sym", calibration=calib)
    theirs = quantize(model, "gptqmodel:4:g32:sym", calibration=calib)
    for a, b in zip(ours.report, theirs.report):
        assert abs(a.rel_weight_error - b.rel_weight_error) < 0.5 * a.rel_weight_error
