"""Reports: Plotly figures drawn from results, and self-contained HTML pages. Nothing is recomputed here.

- :mod:`.figures`         -- trajectory figures from the tidy results table (loss, one series,
  quantization error, curvature; :func:`~.figures.trajectory_figures` draws the figures each sweep
  probe declares and the scatters), and :func:`~.figures.synthetic_results`;
- :mod:`.scatter_figures` -- :func:`~.scatter_figures.sharpness_vs_quant_figure`, sharpness vs
  quantization error with the correlation in its title;
- :mod:`.figure_parts`    -- their building blocks: series out of the table, lines per run, LR, phases;
- :mod:`.explain_figures`, :mod:`.accuracy_figures` -- the explain and accuracy probes' figures;
- :mod:`.flags`           -- values whose estimator did not converge (open red markers) and values whose
  Hessian products' measured error is over the tolerance (open orange diamonds), the report's tables;
- :mod:`.surface_figures` -- :func:`~.surface_figures.surface_figure` and the profiles of a
  :class:`losslens.geometry.surfaces.surface.Surface` / :class:`~losslens.geometry.surfaces.surface.Profile`;
- :mod:`.pages`           -- :func:`~.pages.build_report` (one offline HTML file per sweep),
  :func:`~.pages.surface_page`, :func:`~.pages.export_png`, :func:`~.pages.load_store`;
- :mod:`.page_sections`   -- the parts of a page: CSS, tables, figure divs, the sections built from results.
"""
