"""losslens.geometry.base: the shared pieces every other room builds on; imports no other room.

- ``results``: the result dataclasses of every estimator and :class:`EstimatorError`;
- ``attribution_results``: the result dataclasses of an attribution along a direction;
- ``_linalg``: row-block linear algebra (float64 reductions in chunks, Gram matrices, QR, bases);
- ``params``: parameter selections by name glob and :class:`ParamSpace` (a dict of tensors as a vector);
- ``batches``: how a loss over several batches is weighted;
- ``modes``: eval/train mode for a while, every module's own mode restored after;
- ``jsonable``: plain JSON-ready data from results.

This ``__init__`` imports nothing: import the module you need (``from losslens.geometry.base.results import …``),
or the public names from ``geometry``.
"""
