"""Text sources, tokenizers and the evaluation / calibration / curvature token sets (docs/science.md §1).

    from losslens.lm.data import default_token_sets
    sets = default_token_sets(trajectory)      # {"eval", "calibration", "curvature"}: disjoint, hashed

Modules:

- :mod:`.corpus`     -- :class:`TextSource` (embedded corpus, files, cached ``datasets``, strings) and
  the document-level train / held-out split;
- :mod:`.tokenizers` -- a checkpoint's own tokenizer, a byte-level BPE trained here, raw bytes;
  :func:`tokenizer_fingerprint`;
- :mod:`.token_sets` -- token streams, non-overlapping windows, :func:`build_token_sets` and
  :func:`default_token_sets`;
- :mod:`.framing` -- documents and rows framed as the model's tokenizer frames a document (BOS/EOS),
  :func:`document_framing`, :func:`framing_effect` and :class:`FramingWarning`.

The :class:`~losslens.lm.core.tokenset.TokenSet` container itself lives in :mod:`losslens.lm.core` (every room
uses it); it is re-exported here.

:mod:`losslens.lm.train.tiny` trains on ``split="train"`` of the embedded corpus and validates on
``split="heldout"``; :func:`default_token_sets` draws its evaluation, calibration and curvature
sets from ``split="heldout"``, so the embedded trajectory is never evaluated on its training text.
"""

from losslens.lm.core.tokenset import TokenSet, TokenSetError

from losslens.lm.data.corpus import (
    HELDOUT_MODULUS,
    DataError,
    TextSource,
    embedded_corpus,
    embedded_documents,
    is_heldout,
)
from losslens.lm.data.framing import FramingWarning, document_framing, framing_effect
from losslens.lm.data.token_sets import (
    DEFAULT_SHAPES,
    QUICK_SHAPES,
    build_token_sets,
    default_token_sets,
    plan_windows,
    token_sets_from_stream,
    token_stream,
)
from losslens.lm.data.tokenizers import (
    ByteTokenizer,
    checkpoint_tokenizer,
    load_tokenizer,
    tokenizer_fingerprint,
    tokenizer_name,
    train_bpe_tokenizer,
)

__all__ = [
    "DataError",
    "TokenSet",
    "TokenSetError",
    "TextSource",
    "ByteTokenizer",
    "embedded_corpus",
    "embedded_documents",
    "is_heldout",
    "train_bpe_tokenizer",
    "load_tokenizer",
    "checkpoint_tokenizer",
    "tokenizer_name",
    "tokenizer_fingerprint",
    "token_stream",
    "plan_windows",
    "build_token_sets",
    "token_sets_from_stream",
    "default_token_sets",
    "DEFAULT_SHAPES",
    "QUICK_SHAPES",
    "HELDOUT_MODULUS",
    "document_framing",
    "framing_effect",
    "FramingWarning",
]
