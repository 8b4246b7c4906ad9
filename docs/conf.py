"""Sphinx configuration of the losslens docs (``make docs``; the strict build is tests/test_docs.py).

Offline by construction: no intersphinx (references to torch, numpy, ... are listed in
``nitpick_ignore_regex`` instead of fetched), no theme or extension from outside Sphinx and
myst-parser. The reference documents the checkout this file lives in, not an installed losslens.
"""

from __future__ import annotations

import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

project = "losslens"
author = "the losslens authors"
release = version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
copyright = "losslens authors"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "myst_parser", "rooms"]
source_suffix = {".rst": "restructuredtext"}  # Markdown only where a page includes it (the science)
exclude_patterns = ["_build", "science.md"]
root_doc = "index"
html_theme = "alabaster"
html_static_path: list[str] = []
templates_path: list[str] = []

# autodoc + napoleon: the docstrings are numpy- or Google-style with Sphinx roles
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"
autodoc_inherit_docstrings = False  # torch.nn.Module.forward etc. are not ours
napoleon_google_docstring = True
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_preprocess_types = False

myst_heading_anchors = 3

# Strict: every reference must resolve (make docs passes -W -n). What lives outside the project
# has no target without intersphinx, which would fetch inventories from the network.
nitpicky = True
_EXTERNAL = [
    "torch",
    "numpy",
    "np",
    "pandas",
    "pd",
    "scipy",
    "nn",
    "typer",
    "click",
    "transformers",
    "tokenizers",
    "safetensors",
    "plotly",
    "go",
    "ray",
    "huggingface_hub",
    "datasets",
    "lm_eval",
    "sqlite3",
    "pathlib",
    "collections",
    "typing",
    "os",
    "subprocess",
    "concurrent",
    "multiprocessing",
    "enum",
    "dataclasses",
    "contextlib",
    "functools",
    "json",
    "importlib",
    "inspect",
    "warnings",
    "types",
    "abc",
    "io",
    "threading",
    "pydoc_data",
    "fnmatch",
    "ast",
    "hashlib",
    "sysconfig",
    "accelerate",
    "lightning",
    "curvlinops",
    "pyhessian",
    "bitsandbytes",
    "gptqmodel",
]
nitpick_ignore_regex = [
    # a numpy-style type field that holds prose ("dict name -> Tensor (the origin's shapes)") is split
    # into words; only a dotted identifier can name a class, anything else stays plain text
    (r"py:(class|obj|data)", r".*[^\w.].*"),
    (r"py:.*", rf"({'|'.join(_EXTERNAL)})(\..*)?"),
    # builtins and typing names that appear in signatures and docstrings
    (
        r"py:.*",
        r"(int|float|str|bool|bytes|dict|list|tuple|set|frozenset|object|type|callable|Callable|Any|None|"
        r"Iterable|Iterator|Sequence|Mapping|Path|Tensor|Generator|Literal|Optional|Union|Self|"
        r"TypeVar|ModuleType|Exception|BaseException|ValueError|TypeError|KeyError|RuntimeError|OSError|"
        r"MemoryError|UserWarning|RuntimeWarning|NotImplementedError|FileNotFoundError|LookupError|"
        r"AttributeError|IndexError|ImportError|ModuleNotFoundError|KeyboardInterrupt|"
        r"datetime|timedelta|Counter|OrderedDict|defaultdict|deque|partial|"
        r"default|optional|array-like|array_like|scalar|sequence|mapping|iterable|callable)",
    ),
]
