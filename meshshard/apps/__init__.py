"""Applications on top of the library: model checkpoints, chunked inference, predict, evaluate.

- :mod:`~meshshard.apps.model_file`: checkpoints that carry the model (class, JSON config,
  non-dimensional scales, field names; weights as safetensors or a ``weights_only`` torch
  file; never pickle);
- :mod:`~meshshard.apps.chunked`: exact chunked inference for models whose only couplings
  between points are sums over points (Transolver's slice tokens);
- :mod:`~meshshard.apps.inputs`: a run directory, a meshshard store or a physicsnemo-curator
  store read domain-parallel (each rank a slice, partitioned together);
- :mod:`~meshshard.apps.predict` and :mod:`~meshshard.apps.evaluate`: the ``meshshard
  predict`` / ``meshshard evaluate`` commands' logic;
- :mod:`~meshshard.apps.forces`: drag and lift from surface pressure and wall shear.

Nothing here is imported by ``import meshshard``.
"""
