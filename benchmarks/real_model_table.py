"""The benchmarks/README.md table of :mod:`benchmarks.real_model`: one line per measured quantity, with
what the memory plan chose (the Hutch++ sketch, the Lanczos basis, graphs kept or rebuilt)."""

from __future__ import annotations


def _fmt(x, spec=".4g") -> str:
    return "" if x is None else (format(x, spec) if isinstance(x, float) else str(x))


def markdown(rows: list[dict]) -> str:
    """The benchmarks/README.md table: one line per measured quantity."""
    head = ("| load → compute | backend | quantity | value | products | s / product | wall s | plan GB | peak GB | "
            "chosen | convergence | product error |")  # fmt: skip
    lines = [head, "|" + " --- |" * 12]
    for r in rows:
        if r["tool"] == "setup":
            continue
        conv = ""
        if "converged" in r:
            conv = f"{'converged' if r['converged'] else 'not converged'}"
            conv += f", residual {r['residual']:.2g}" if "residual" in r else ""
        elif r.get("stderr") is not None:
            conv = f"± {r['stderr']:.3g} (stderr)"
        err = r.get("product_error")
        if "same_vector_rel_diff" in r:
            err = f"same vector vs losslens reverse: {r['same_vector_rel_diff']:.1e}"
            if "same_vector_rel_diff_padding_cleared" in r:
                err += f" ({r['same_vector_rel_diff_padding_cleared']:.1e} with padding_idx cleared)"
        elif "errors" in r:
            err = "errors " + ", ".join(f"{e:.1e}" for e in r["errors"])
            if "errors_vs_masked" in r:
                err += "; vs the masked reference " + ", ".join(f"{e:.1e}" for e in r["errors_vs_masked"])
        elif isinstance(err, float):
            err = f"{err:.1e} (recorded)"
        elif r["backend"] == "reverse":
            err = "exact (none recorded)"
        lines.append(
            f"| {r['load']} → {r['compute']} | {r['backend']} | {r['quantity']} | {_fmt(r.get('value'))} | "
            f"{r.get('products', '')} | {_fmt(r.get('s_per_product'), '.1f')} | {_fmt(r.get('seconds'), '.0f')} | "
            f"{_fmt(r.get('plan_GB'), '.2f')} | {_fmt(r.get('peak_GB'), '.2f')} | {chosen(r.get('settings'))} | "
            f"{conv} | {_fmt(err)} |"
        )
    return "\n".join(lines)


def chosen(settings: dict | None) -> str:
    """What the memory plan chose (``memory["settings"]`` of an estimate): the Hutch++ sketch or the
    Lanczos basis, and whether the reverse pass's graphs are kept between products."""
    if not settings:
        return ""
    out = []
    if "sketch_size" in settings:
        out.append(f"sketch {settings['sketch_size']}" + (" (capped)" if settings.get("sketch_capped") else ""))
    if "basis_size" in settings:
        out.append(f"basis {settings['basis_size']}")
    if "cache_graphs" in settings:
        out.append("graphs kept" if settings["cache_graphs"] else "graphs rebuilt")
    return ", ".join(out)
