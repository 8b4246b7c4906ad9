"""The generator the task's YAML points to (``custom_dataset: !function utils.load_dataset``)."""

from losslens.measure.accuracy.embedded import load_dataset

__all__ = ["load_dataset"]
