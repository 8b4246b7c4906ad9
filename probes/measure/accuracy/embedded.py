"""The embedded offline task ``losslens_pydoc_mc``: multiple choice from the held-out embedded corpus.

Each item is a passage of a **held-out** document of the embedded corpus (:mod:`losslens.lm.data.corpus`:
pydoc topics + stdlib docstrings of the *running* CPython, ~10% of documents held out by name hash,
never trained on by :mod:`losslens.lm.train.tiny`) and four candidate continuations: the true next
``choice_words`` (4) words and three **reorderings of those same words** (so every candidate holds
the same words of the same document, has the same length in characters and in tokens, and only
word order in context tells them apart). Built by :func:`build_items`, deterministically:

- whitespace is collapsed to single spaces; a document is cut into consecutive, non-overlapping
  windows of ``prompt_words + choice_words`` words; the prompt is the first ``prompt_words`` words
  (no trailing space), the gold choice the next ``choice_words`` words with a leading space, so the
  scored continuation starts at a word boundary (lm-eval's ``target_delimiter`` is "");
- a window is kept when its prompt has at most ``PROMPT_CHARS`` characters and its gold at
  most ``CHOICE_CHARS``; the distractors are three distinct orderings of the gold's words,
  each different from the gold (a window whose words allow fewer gives no item);
- the distractors and the gold's position (0–3) are drawn with ``random.Random`` seeded by
  the SHA-256 of ``(document name, window index)``, so items do not depend on each other or on
  the document order;
- items whose prompt appears twice are dropped (both), so no item is duplicated;
- **fit**: every kept item has prompt + longest choice (encoded together, as lm-eval does) ≤
  :data:`CONTEXT_TOKENS` (64) tokens under the
  reference tokenizer, a byte-level BPE of :data:`REFERENCE_VOCAB` (384) entries trained on the
  *train* split of the same corpus (:func:`reference_tokenizer`). The project's tiny models use
  BPEs of 384–1024 entries trained the same way; BPE merges of a larger vocabulary extend those
  of a smaller one, so their token counts are never larger (tested for 384 and 512).

Zero-shot, two metrics: ``acc`` (sum of the continuation's log-likelihood) and ``acc_norm`` (per
byte; the same choice here, since all choices have the same bytes). All choices have the same
length, so a length-only rule (always the longest or shortest choice) picks by its tie-break and
scores chance (``length_baselines``; benchmarks/README.md).

**Why reorderings** (issue #28: "if they do not climb, change the task"). The first version drew
the three distractors from 4-word spans at other positions of the same document. Trained tiny
models did not climb on it: a 58k-parameter model (hidden 32, vocab 384, context 64) trained 60 →
240 steps (validation loss 4.51 → 3.60) scored 0.255 / 0.253 / 0.265 / 0.258 (± 0.022, 400 items),
because the sum log-likelihood of a span is dominated by how common its words are, not by the
context. Distractors from *other* held-out documents gave 0.30 → 0.32. Reorderings of the true
words remove that confound (same words, same length) and climbed 0.38 → 0.58 on the same two
checkpoints (400 items); the demo-size numbers are in benchmarks/README.md.

Each item records the corpus it came from (``corpus``: CPython version, the ``pydoc_data`` topics
header line and the SHA-256 of the held-out documents), because the corpus is the running
interpreter's. Items are cached on disk per corpus (``$LOSSLENS_CACHE_DIR``, like the corpus); the
first build costs ~2 s (reference tokenizer + tokenizing ~2,000 windows).

Why a generator rather than a shipped ``.jsonl``: the corpus is the running CPython's, and its
held-out split is by document name; a file generated on another CPython would hold passages that
are not this interpreter's held-out text (or are missing from it). The task folder
(``tasks/losslens_pydoc_mc``) is an ordinary lm-eval task whose ``custom_dataset`` calls
:func:`load_dataset`; :func:`export_task` writes the same items as a plain
``dataset_path: json`` task folder (YAML + ``.jsonl``) for users who want a frozen copy.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import platform
import random
from functools import lru_cache
from pathlib import Path

__all__ = [
    "TASK_NAME",
    "TASK_DIR",
    "CONTEXT_TOKENS",
    "REFERENCE_VOCAB",
    "build_items",
    "embedded_items",
    "load_dataset",
    "export_task",
    "reference_tokenizer",
    "corpus_record",
    "length_baselines",
]

TASK_NAME = "losslens_pydoc_mc"
TASK_DIR = Path(__file__).parent / "tasks" / TASK_NAME
"""The lm-eval task folder shipped with the package (YAML + the generator it points to)."""
FORMAT = 2
#: Most tokens of prompt + longest choice under the reference tokenizer.
CONTEXT_TOKENS = 64
#: Entries of the reference byte-level BPE the items are checked against.
REFERENCE_VOCAB = 384
PROMPT_WORDS = 10
CHOICE_WORDS = 4
#: Most characters of an item's prompt.
PROMPT_CHARS = 80
#: Most characters of an item's gold continuation.
CHOICE_CHARS = 32
N_CHOICES = 4


@lru_cache(maxsize=1)
def reference_tokenizer():
    """The BPE (:data:`REFERENCE_VOCAB` entries) trained on the train split of the embedded corpus,
    against which items are checked to fit :data:`CONTEXT_TOKENS`. Cost ~1 s, once per process."""
    from losslens.lm.data import embedded_documents, train_bpe_tokenizer

    return train_bpe_tokenizer(
        [t for _, t in embedded_documents(True, "train")], REFERENCE_VOCAB, name=f"losslens-bpe-{REFERENCE_VOCAB}"
    )


def _heldout() -> list[tuple[str, str]]:
    from losslens.lm.data import embedded_documents

    return embedded_documents(True, "heldout")


def corpus_record(docs: list[tuple[str, str]] | None = None) -> dict:
    """Where the items come from: CPython version, the pydoc_data topics header, the held-out
    documents' count and SHA-256."""
    import pydoc_data.topics as topics

    docs = _heldout() if docs is None else docs
    h = hashlib.sha256()
    for name, text in docs:
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    try:
        header = next(
            (
                ln.strip("# ").strip()
                for ln in Path(topics.__file__).read_text(encoding="utf-8").splitlines()
                if ln.startswith("#")
            ),
            "",
        )
    except OSError:
        header = ""
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "pydoc_data": header,
        "split": "heldout",
        "n_documents": len(docs),
        "sha256": h.hexdigest(),
    }


def _span(words: list[str], start: int, n: int) -> str:
    return " ".join(words[start : start + n])


def _rng(name: str, index: int) -> random.Random:
    return random.Random(int(hashlib.sha256(f"{name}\0{index}".encode()).hexdigest()[:16], 16))


def build_items(
    docs: list[tuple[str, str]] | None = None,
    tokenizer=None,
    prompt_words: int = PROMPT_WORDS,
    choice_words: int = CHOICE_WORDS,
    context_tokens: int = CONTEXT_TOKENS,
) -> list[dict]:
    """The task's items from ``docs`` (default: the held-out embedded documents), in document order.

    Each item: ``{"id", "doc", "window", "prompt", "choices" [4 str], "gold" (0–3), "corpus"}``.
    ``tokenizer`` (default :func:`reference_tokenizer`) checks the fit: prompt + longest choice ≤
    ``context_tokens`` tokens. Deterministic (module docstring). Cost: one encode per candidate.
    """
    docs = _heldout() if docs is None else docs
    tok = reference_tokenizer() if tokenizer is None else tokenizer
    corpus = json.dumps(corpus_record(docs), sort_keys=True)
    width = prompt_words + choice_words
    items: list[dict] = []
    for name, text in docs:
        words = text.split()
        for w in range(len(words) // width):
            start = w * width
            prompt = _span(words, start, prompt_words)
            gold = " " + _span(words, start + prompt_words, choice_words)
            if len(prompt) > PROMPT_CHARS or len(gold) > CHOICE_CHARS + 1:
                continue
            rng = _rng(name, w)
            gw = words[start + prompt_words : start + width]
            others = sorted({" " + " ".join(p) for p in itertools.permutations(gw)} - {gold})
            if len(others) < N_CHOICES - 1:
                continue
            distract = rng.sample(others, N_CHOICES - 1)
            g = rng.randrange(N_CHOICES)
            choices = distract[:g] + [gold] + distract[g:]
            if max(len(tok.encode(prompt + c)) for c in choices) > context_tokens:
                continue
            items.append({"doc": name, "window": w, "prompt": prompt, "choices": choices, "gold": g})
    counts: dict[str, int] = {}
    for it in items:
        counts[it["prompt"]] = counts.get(it["prompt"], 0) + 1
    items = [it for it in items if counts[it["prompt"]] == 1]
    for i, it in enumerate(items):
        it["id"] = i
        it["corpus"] = corpus
    return items


def _cache_path() -> Path | None:
    from losslens.lm.data.corpus import _disk_cache_dir

    folder = _disk_cache_dir()
    if folder is None:
        return None
    import sys
    import sysconfig
    import tokenizers

    key = hashlib.sha256(
        json.dumps(
            [
                FORMAT,
                sys.version,
                sysconfig.get_paths()["stdlib"],
                tokenizers.__version__,
                PROMPT_WORDS,
                CHOICE_WORDS,
                PROMPT_CHARS,
                CHOICE_CHARS,
                CONTEXT_TOKENS,
                REFERENCE_VOCAB,
            ]
        ).encode()
    ).hexdigest()[:16]
    return folder / f"{TASK_NAME}-{key}.json"


@lru_cache(maxsize=1)
def _cached_items() -> tuple[str, ...]:
    path = _cache_path()
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("sha256") == hashlib.sha256(json.dumps(data["items"]).encode()).hexdigest():
                return tuple(json.dumps(it) for it in data["items"])
        except (OSError, ValueError, KeyError):
            pass
    items = build_items()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(
                json.dumps({"sha256": hashlib.sha256(json.dumps(items).encode()).hexdigest(), "items": items}),
                encoding="utf-8",
            )
            os.replace(tmp, path)
        except OSError:
            pass
    return tuple(json.dumps(it) for it in items)


def embedded_items() -> list[dict]:
    """:func:`build_items` of the running CPython's corpus (cached on disk and per process)."""
    return [json.loads(s) for s in _cached_items()]


def load_dataset(**_ignored):
    """The ``custom_dataset`` of the shipped lm-eval task: ``DatasetDict({"test": Dataset})`` of
    :func:`embedded_items`. lm-eval passes the task's metadata as keyword arguments (ignored)."""
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(embedded_items())})


_YAML = """\
# losslens embedded task, frozen copy ({corpus}); see probes/measure/accuracy/embedded.py
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{prompt}}}}"
doc_to_choice: choices
doc_to_target: gold
target_delimiter: ""
num_fewshot: 0
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: {version}
"""


def export_task(folder: str | Path, task: str = TASK_NAME + "_frozen", items: list[dict] | None = None) -> Path:
    """Write ``folder/{task}.yaml`` + ``folder/{task}.jsonl``: the items (default
    :func:`embedded_items`) as a plain lm-eval ``dataset_path: json`` task (``data_files`` is the
    absolute path of the ``.jsonl``, since lm-eval resolves it from the working directory).
    Returns the YAML path; pass it (or the folder) to ``--tasks``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    items = embedded_items() if items is None else items
    data = (folder / f"{task}.jsonl").resolve()
    data.write_text("".join(json.dumps(it) + "\n" for it in items), encoding="utf-8")
    rec = json.loads(items[0]["corpus"]) if items else {}
    yaml_path = folder / f"{task}.yaml"
    yaml_path.write_text(
        _YAML.format(
            task=task,
            data=json.dumps(str(data)),
            version=float(FORMAT),
            corpus=f"CPython {rec.get('python', '?')}, {len(items)} items",
        ),
        encoding="utf-8",
    )
    return yaml_path


def length_baselines(items: list[dict]) -> dict[str, float]:
    """Accuracy of always picking the longest / shortest choice in characters (ties: the first
    such choice), and chance (1/4). A fair task puts both near chance."""
    longest = sum(max(range(len(it["choices"])), key=lambda i: len(it["choices"][i])) == it["gold"] for it in items)
    shortest = sum(min(range(len(it["choices"])), key=lambda i: len(it["choices"][i])) == it["gold"] for it in items)
    n = max(len(items), 1)
    return {"longest": longest / n, "shortest": shortest / n, "chance": 1.0 / N_CHOICES, "n": len(items)}
