"""losslens.measure: the measurements of one checkpoint.

- :mod:`losslens.measure.probes` -- the probes a sweep runs on every checkpoint, one module each,
  and their registry;
- :mod:`losslens.measure.sharpness` -- one checkpoint's curvature, measured once (what
  ``losslens sharpness`` prints) and the estimator names a caller may ask for;
- :mod:`losslens.measure.explain` -- why a quantizer hurts: ΔL split into gradient, curvature and
  remainder, and into layers;
- :mod:`losslens.measure.accuracy` -- task accuracy of FP and quantized models through
  lm-evaluation-harness, with the embedded offline task.

The room imports nothing at package level.
"""
