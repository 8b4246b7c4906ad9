"""``python -m benchmarks.gpu``: the one-command GPU check (see :mod:`benchmarks.gpu`)."""

from benchmarks.gpu import main

main()
