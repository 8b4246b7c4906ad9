"""losslens.geometry.memory: the memory model; imports ``losslens.geometry.base`` only.

- ``budget``: how many bytes a run may use (``max_memory`` parsed, the machine's memory, the default
  budget) and :class:`MemoryBudgetError`;
- ``model``: :class:`MemoryEstimate` and the parts every plan counts (vectors, chunk temporaries, one
  operator pass);
- ``allocator``: the host allocator's retention (``return_freed_memory``, ``--strict-memory``);
- ``graphs``: measuring a batch's autograd graph (saved-tensor hooks on one row) and the peak of
  tracked allocations (``peak_new_bytes``).

This ``__init__`` imports nothing: import the module you need (``from losslens.geometry.memory.model import …``).
"""
