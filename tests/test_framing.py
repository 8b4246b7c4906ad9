"""Issue #47 item 5: token sets framed as the model's own tokenizer frames a document.

A tiny character-level ``PreTrainedTokenizerFast`` whose post-processor adds BOS (as Llama 3's and
Gemma's do): the stream is the documents as ``tokenizer(doc)`` gives them, every evaluation /
calibration / curvature row starts with BOS, the framing is in the meta and the hash, and the loss of
the set is the model's own ``labels=`` loss on the same rows. Tokenizers that add nothing keep
their sets (and hashes) as before."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

from losslens.lm.core.next_token_loss import evaluate
from losslens.lm.data import TextSource, build_token_sets, token_stream
from losslens.lm.data.framing import FramingWarning, document_framing, framed_rows, framing_effect

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SHAPES = {"eval": (2, 2, 16), "calibration": (1, 2, 16), "curvature": (1, 2, 16)}
CHARS = "abcdefghijklmnopqrstuvwxyz .,\n"


def _tokenizer(template: str = "<s> $A"):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    if template:
        tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=[("<s>", 0), ("</s>", 1)])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        add_bos_token=bool(template),
        add_eos_token="</s>" in template,
    )


def _text(n_paragraphs: int = 24) -> str:
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"]
    return "\n\n".join(" ".join(rng.choice(words) for _ in range(60)) + "." for _ in range(n_paragraphs))


def _model(vocab: int):
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_the_framing_is_read_off_the_tokenizer():
    assert document_framing(_tokenizer()).as_meta() == {"name": "bos", "prefix": [0], "suffix": []}
    assert document_framing(_tokenizer("<s> $A </s>")).name == "bos+eos"
    assert document_framing(_tokenizer("")).name == "none"
    from losslens.lm.data import ByteTokenizer, train_bpe_tokenizer

    assert document_framing(ByteTokenizer()).name == "none"
    assert document_framing(train_bpe_tokenizer(_text(4), vocab_size=300)).name == "none"  # the demo's BPE


def test_rows_start_with_bos_and_the_stream_is_the_tokenizers_own():
    tok, text = _tokenizer(), _text()
    source = TextSource.from_text(text)
    stream = token_stream(tok, source, document_framing(tok))
    own = [i for _, doc in source.documents() for i in tok(doc)["input_ids"]]  # tokenizer(doc), one after another
    assert stream.tolist() == own and len(source.documents()) > 2
    sets = build_token_sets(tok, source, SHAPES)
    starts = set()
    for name, ts in sets.items():
        rows = ts.sequences()
        assert (rows[:, 0] == tok.bos_token_id).all(), name  # every row framed
        assert ts.meta["framing"] == {"name": "bos", "prefix": [0], "suffix": []}
        for row, start in zip(rows, ts.meta["window_starts"]):
            window = stream[start : start + 16]
            assert torch.equal(row, window) or torch.equal(row[1:], window[:15])  # text of its own window only
            starts.add(start)
    assert len(starts) == sum(nb * b for nb, b, _ in SHAPES.values())  # disjoint windows
    unframed = build_token_sets(tok, source, SHAPES, frame=False)
    assert unframed["eval"].meta["framing"]["declined"] == "bos"
    assert unframed["eval"].content_hash != sets["eval"].content_hash
    assert (unframed["eval"].sequences()[:, 0] != tok.bos_token_id).any()


def test_a_window_at_a_document_start_keeps_its_own_bos():
    stream = torch.tensor([0, 5, 6, 7, 8, 0, 9, 10, 11, 12])
    rows = framed_rows(stream, torch.tensor([0, 5]).numpy(), 4, document_framing(_tokenizer()))
    assert rows.tolist() == [[0, 5, 6, 7], [0, 9, 10, 11]]
    rows = framed_rows(stream, torch.tensor([1, 6]).numpy(), 4, document_framing(_tokenizer()))
    assert rows.tolist() == [[0, 5, 6, 7], [0, 9, 10, 11]]


def test_the_loss_is_the_models_own_labels_loss_on_the_framed_rows():
    tok = _tokenizer()
    model = _model(len(tok))
    ev = build_token_sets(tok, _text(), SHAPES)["eval"]
    got = evaluate(model, ev).loss
    with torch.no_grad():
        own = [float(model(input_ids=b, labels=b).loss) for b in ev]  # HF shifts the labels itself
    assert got == pytest.approx(sum(own) / len(own), rel=1e-6)
    assert ev.sequences()[0, 0] == tok.bos_token_id


def test_a_framing_that_moves_the_loss_gets_a_note():
    tok = _tokenizer()
    model = _model(len(tok))
    ev = build_token_sets(tok, _text(), SHAPES)["eval"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = framing_effect(model, ev, rtol=10.0)
    assert quiet["framing"] == "bos" and quiet["rel_change"] != 0.0
    with pytest.warns(FramingWarning, match="depends on the document framing"):
        framing_effect(model, ev, rtol=0.0)
    none = build_token_sets(tok, _text(), SHAPES, frame=False)["eval"]
    assert framing_effect(model, none) is None  # nothing framed: nothing to compare


def test_the_loss_probe_records_the_framing():
    from losslens.measure.probes import loss
    from losslens.measure.probes.state import CheckpointState

    tok = _tokenizer()
    model = _model(len(tok))
    st = CheckpointState(model, None, {"eval": build_token_sets(tok, _text(), SHAPES)["eval"]})
    row = loss.run(st, None)
    assert row.extra["framing"] == "bos" and isinstance(row.extra["framing_rel_change"], float)
