"""losslens.probes: language-model measurements built on geometry.

Rooms (what each may import, and where to add things: ARCHITECTURE.md): :mod:`probes.core`,
:mod:`probes.checkpoints`, :mod:`probes.data`, :mod:`probes.models`, :mod:`probes.quant`,
:mod:`probes.train`, :mod:`probes.sweep`, :mod:`probes.analysis`, :mod:`probes.report`, and the
CLI (:mod:`probes.cli`, :mod:`probes.commands`, :mod:`probes.demo`).
"""
