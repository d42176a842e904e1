"""Composition with the rest of PyTorch parallelism (plans and helpers; no second tensor type).

Tensor parallelism: :mod:`meshshard.parallel.tensor` (styles, ``parallelize_module``, the 3-D
``("data", "domain", "tensor")`` mesh) and :mod:`meshshard.parallel.plans` (the Transolver plan).
"""
