"""The work of each ``meshshard`` command, one module per command with ``run(args) -> int``.

:mod:`meshshard.cli` imports a command's handler only when the command runs: the modules of
:mod:`meshshard.commands` that build the parser (``add_args``) import no torch, numpy, zarr or
pyvista, and the handlers import what they need at their top.
"""
