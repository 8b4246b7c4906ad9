"""The notebooks in notebooks/ run top to bottom (quick mode) and are saved without outputs.

Each notebook is executed with nbclient in a fresh ipykernel running *this* interpreter (a private
kernelspec pointing at ``sys.executable``, so a ``python3`` kernelspec elsewhere on the machine is
never picked up), with ``LOSSLENS_NB_QUICK=1`` (toy sizes) and a temporary work folder shared by the
notebooks of one test session (notebook 02 reuses the trajectory trained by 01). Budget: < 60 s per
notebook on an idle 2-core machine.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAMES = ["01_sharpness_sweep.ipynb", "02_loss_surfaces.ipynb", "03_hvp_benchmark.ipynb"]
CELL_TIMEOUT = 300  # seconds per cell (generous: the test machine is shared)
PLOTLY_MIME = "application/vnd.plotly.v1+json"

# what each notebook must show: the number of Plotly figures at least, and text that must appear
EXPECT = {
    "01_sharpness_sweep.ipynb": dict(figures=4, text=["trace vs ΔQ(", "pearson"]),
    "02_loss_surfaces.ipynb": dict(figures=4, text=["ΔQ = L(C)"]),
    "03_hvp_benchmark.ipynb": dict(figures=1, text=["symmetry:"]),
}


def _kernel_manager(tmp: Path):
    """A KernelManager whose python3 kernelspec runs this interpreter."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    kdir = tmp / "kernels" / "python3"
    kdir.mkdir(parents=True, exist_ok=True)
    (kdir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (losslens tests)",
                "language": "python",
            }
        )
    )
    ksm = KernelSpecManager(kernel_dirs=[str(tmp / "kernels")])
    return KernelManager(kernel_name="python3", kernel_spec_manager=ksm)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("nb-work")


def _outputs(nb):
    for cell in nb.cells:
        if cell.cell_type == "code":
            yield from cell.get("outputs", [])


def _text(nb) -> str:
    parts = []
    for out in _outputs(nb):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "\n".join(parts)


def _n_figures(nb) -> int:
    n = 0
    for out in _outputs(nb):
        data = out.get("data", {})
        if PLOTLY_MIME in data or "plotly" in str(data.get("text/html", "")).lower():
            n += 1
    return n


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, workdir, tmp_path, monkeypatch):
    monkeypatch.setenv("LOSSLENS_NB_QUICK", "1")
    monkeypatch.setenv("LOSSLENS_NB_WORKDIR", str(workdir))
    monkeypatch.setenv("LOSSLENS_NB_THREADS", "1")
    monkeypatch.delenv("LOSSLENS_NB_TRAJECTORY", raising=False)
    for var, val in (
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        ("TOKENIZERS_PARALLELISM", "false"),
        ("OMP_NUM_THREADS", "1"),
    ):
        monkeypatch.setenv(var, val)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    km = _kernel_manager(tmp_path)
    client = nbclient.NotebookClient(
        nb, km=km, kernel_name="python3", timeout=CELL_TIMEOUT, resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    t0 = time.perf_counter()
    try:
        client.execute()  # raises CellExecutionError (with the traceback) if any cell fails
    finally:
        if km.has_kernel:  # a kernel manager we pass in is not shut down by nbclient
            km.shutdown_kernel(now=True)
    seconds = time.perf_counter() - t0
    print(f"{name}: {seconds:.1f} s")
    errors = [o for o in _outputs(nb) if o.get("output_type") == "error"]
    assert not errors, errors
    assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code"), "a code cell did not run"
    expect = EXPECT[name]
    assert _n_figures(nb) >= expect["figures"], f"{name}: expected >= {expect['figures']} Plotly figures"
    text = _text(nb)
    for snippet in expect["text"]:
        assert snippet in text, f"{name}: {snippet!r} not in the outputs"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_saved_clean(name):
    """Saved without outputs or execution counts, valid nbformat, first code cell tagged 'parameters'."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{name} has no code cell"
    for c in code:
        assert c.get("outputs") == [], f"{name}: a code cell has saved outputs (strip them)"
        assert c.get("execution_count") is None, f"{name}: a code cell has an execution count (strip it)"
    assert "parameters" in code[0].metadata.get("tags", []), f"{name}: the first code cell must be tagged 'parameters'"
    src = code[0].source
    assert "LOSSLENS_NB_QUICK" in src and "LOSSLENS_NB_WORKDIR" in src
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
