"""losslens.study: a whole trajectory studied.

- :mod:`losslens.study.sweep` -- plans, executors and the resumable store;
- :mod:`losslens.study.analysis` -- series, correlations with intervals, phases, summaries;
- :mod:`losslens.study.report` -- Plotly figures and the self-contained HTML report;
- :mod:`losslens.study.monitor` -- the training-time robustness monitor;
- :mod:`losslens.study.landscape` -- principal planes through whole trajectories;
- :mod:`losslens.study.demo` -- ``losslens demo``: the whole study on the embedded trajectories;
- :mod:`losslens.study.bench_suite` -- ``losslens bench``: the benchmark suite in ``benchmarks/``.

The room imports nothing at package level.
"""
