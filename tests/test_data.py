"""Text sources, tokenizers and token sets: determinism, hashing, disjointness, bad input."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from losslens.lm.data import (
    ByteTokenizer,
    DataError,
    TextSource,
    TokenSetError,
    build_token_sets,
    default_token_sets,
    embedded_documents,
    is_heldout,
    load_tokenizer,
    plan_windows,
    token_stream,
    tokenizer_fingerprint,
    train_bpe_tokenizer,
)
from losslens.lm.core.tokenset import TokenSet

TEXT = "\n\n".join(
    f"Paragraph {i}: the quick brown fox number {i * 7 % 13} jumps over the lazy dog. " * 3 for i in range(60)
)


def _windows(ts: TokenSet) -> set[int]:
    """Token positions covered by a set's windows."""
    s = ts.seq_len
    return {p for start in ts.meta["window_starts"] for p in range(start, start + s)}


def test_embedded_corpus_is_real_deterministic_and_split():
    docs = embedded_documents()
    assert len(docs) > 500 and sum(len(t) for _, t in docs) > 1_000_000
    names = [n for n, _ in docs]
    assert names[0].startswith("topics:") and any(n.startswith("doc:") for n in names)
    assert len(set(names)) > 0.95 * len(names)
    assert embedded_documents() == docs  # cached, same order
    train, held = embedded_documents(split="train"), embedded_documents(split="heldout")
    assert len(train) + len(held) == len(docs)
    assert not {n for n, _ in train} & {n for n, _ in held}
    frac = sum(len(t) for _, t in held) / sum(len(t) for _, t in docs)
    assert 0.05 < frac < 0.2
    assert all(is_heldout(n) for n, _ in held)
    topics_only = embedded_documents(docstrings=False)
    assert all(n.startswith("topics:") for n, _ in topics_only)


def test_byte_tokenizer_and_stream():
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("héllo")) == "héllo"
    src = TextSource.from_text("ab\n\ncd", name="t")
    stream = token_stream(tok, src)
    assert stream.tolist() == [97, 98, 10, 10, 99, 100, 256]  # one document, then EOS
    assert load_tokenizer("bytes").vocab_size == 257


def test_bpe_tokenizer_deterministic_and_reloadable(tmp_path):
    docs = [t for _, t in embedded_documents(docstrings=False)]
    a = train_bpe_tokenizer(docs, 300, tmp_path / "a")
    b = train_bpe_tokenizer(docs, 300, tmp_path / "b")
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(b)
    assert len(a) == 300 and a.eos_token == "<|endoftext|>"
    again = load_tokenizer(tmp_path / "a")
    text = "The quick brown fox: def f(x): return x ** 2"
    assert again.encode(text, add_special_tokens=False) == a.encode(text, add_special_tokens=False)
    assert again.decode(again.encode(text, add_special_tokens=False)) == text
    with pytest.raises(DataError, match="257"):
        train_bpe_tokenizer(docs, 100)


def test_token_sets_disjoint_shapes_meta():
    shapes = {"eval": (4, 2, 16), "calibration": (3, 2, 8), "curvature": (2, 3, 16)}
    sets = build_token_sets("bytes", TEXT, shapes, seed=3)
    assert {k: tuple(v.tokens.shape) for k, v in sets.items()} == shapes
    cover = {k: _windows(v) for k, v in sets.items()}
    assert not cover["eval"] & cover["calibration"] and not cover["eval"] & cover["curvature"]
    assert not cover["calibration"] & cover["curvature"]
    for ts in sets.values():  # windows within a set do not overlap either
        starts = sorted(ts.meta["window_starts"])
        assert all(b - a >= ts.seq_len for a, b in zip(starts, starts[1:]))
    stream = token_stream(ByteTokenizer(), TextSource.from_text(TEXT))
    ev = sets["eval"]
    for i, start in enumerate(ev.meta["window_starts"]):
        assert torch.equal(ev.sequences()[i], stream[start : start + 16])
    m = ev.meta
    assert m["tokenizer"] == "bytes" and m["shapes"]["curvature"] == [2, 3, 16] and m["seed"] == 3
    assert m["source"].startswith("text:") and m["stream_tokens"] == len(stream)


def test_plan_windows_property():
    rng = np.random.default_rng(0)
    for trial in range(20):
        shapes = {
            f"s{i}": (int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.choice([4, 8, 16]))) for i in range(3)
        }
        n = int(rng.integers(400, 1000))
        try:
            plan = plan_windows(n, shapes, seed=trial)
        except TokenSetError:
            continue
        used = np.zeros(n, dtype=int)
        for name, starts in plan.items():
            s = shapes[name][2]
            assert len(starts) == shapes[name][0] * shapes[name][1]
            for a in starts:
                assert a + s <= n
                used[a : a + s] += 1
        assert used.max() <= 1


def test_hash_stable_across_runs_and_sensitive_to_data(tmp_path):
    shapes = {"eval": (2, 2, 16)}
    h1 = build_token_sets("bytes", TEXT, shapes, seed=0)["eval"].content_hash
    assert build_token_sets("bytes", TEXT, shapes, seed=0)["eval"].content_hash == h1
    code = (
        "from tests.test_data import TEXT; from losslens.lm.data import build_token_sets; "
        "print(build_token_sets('bytes', TEXT, {'eval': (2, 2, 16)}, seed=0)['eval'].content_hash)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]),
    )
    assert out.stdout.strip() == h1  # another process (new hash seeds, fresh caches) agrees
    assert build_token_sets("bytes", TEXT, shapes, seed=1)["eval"].content_hash != h1
    assert build_token_sets("bytes", TEXT.replace("fox", "cat"), shapes, seed=0)["eval"].content_hash != h1
    ts = build_token_sets("bytes", TEXT, shapes, seed=0)["eval"]
    back = TokenSet.load(ts.save(tmp_path / "eval.safetensors"))
    assert back.content_hash == h1 and back.meta["window_starts"] == ts.meta["window_starts"]


def test_too_short_stream_errors():
    with pytest.raises(TokenSetError, match=r"'eval'.*shorter than one batch of 4096 tokens"):
        build_token_sets("bytes", "tiny text", {"eval": (1, 32, 128)})
    assert len(TEXT.encode()) + 1 < 13 * 1024  # the byte stream holds 96 windows of 128
    with pytest.raises(TokenSetError, match=r"'curvature'.*needs 2048 tokens.*after the sets eval"):
        build_token_sets("bytes", TEXT, {"eval": (11, 8, 128), "curvature": (2, 8, 128)})
    with pytest.raises(TokenSetError, match="seq must be >= 2"):
        build_token_sets("bytes", TEXT, {"eval": (1, 1, 1)})


def test_text_file_and_folder_sources(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.txt").write_text(TEXT[: len(TEXT) // 2])
    (tmp_path / "docs" / "a.md").write_text(TEXT[len(TEXT) // 2 :])
    (tmp_path / "docs" / "skip.bin").write_bytes(b"\x00\x01")
    folder = TextSource.from_path(tmp_path / "docs")
    names = [n for n, _ in folder.documents()]
    assert names[0].startswith("a.md#") and any(n.startswith("b.txt#") for n in names)
    sets = build_token_sets("bytes", tmp_path / "docs", {"eval": (2, 2, 32)})
    assert sets["eval"].meta["source"] == f"path:{(tmp_path / 'docs').resolve()}"
    single = TextSource.parse(str(tmp_path / "docs" / "b.txt"))
    assert single.kind == "path" and len(single.documents()) >= 2
    assert TextSource.parse("embedded:heldout") == TextSource.embedded("heldout")
    with pytest.raises(DataError, match="does not exist"):
        TextSource.from_path(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no .txt"):
        TextSource.from_path(tmp_path / "empty").documents()


def test_dataset_source_needs_datasets_or_cache():
    src = TextSource.parse("dataset:wikitext:wikitext-2-raw-v1@validation")
    assert src.kind == "dataset" and "wikitext" in src.describe()
    with pytest.raises(DataError, match="datasets|cache"):
        src.documents()


def test_default_token_sets_bytes_quick():
    sets = default_token_sets("bytes", quick=True)
    assert set(sets) == {"eval", "calibration", "curvature"}
    assert sets["eval"].meta["source"] == "embedded[heldout]"
    cover = {k: _windows(v) for k, v in sets.items()}
    assert not cover["eval"] & cover["calibration"] and not cover["calibration"] & cover["curvature"]
    assert default_token_sets("bytes", quick=True)["eval"].content_hash == sets["eval"].content_hash
    assert default_token_sets("bytes", quick=True, seq_len=16)["curvature"].seq_len == 16


def test_missing_tokenizer_folder(tmp_path):
    with pytest.raises(DataError, match="no tokenizer"):
        load_tokenizer(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
