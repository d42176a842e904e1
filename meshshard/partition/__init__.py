"""Partitioners for unstructured meshes and point clouds, and the record of a cut."""

from meshshard.partition.record import SCHEMA_VERSION, HaloPlan, Partition

__all__ = ["SCHEMA_VERSION", "HaloPlan", "Partition"]
