"""Reading files: VTK XML (incl. LZ4, appended data, several pieces), STL geometry, gmsh meshes.

Depends on numpy (and optionally vtk / gmsh) only; nothing here knows about stores, partitions
or process groups.

- :mod:`~meshshard.io.vtkxml`: meshshard's own VTK XML decoder (:class:`VtkXmlFile`,
  :func:`read_cells`), only the named arrays, in parallel;
- :mod:`~meshshard.io.vtkguard`: checks run before VTK sees a file;
- :mod:`~meshshard.io.vtklog`: VTK's own messages captured and turned into errors;
- :mod:`~meshshard.io.geometry`: cell centres, normals and areas of polygon meshes;
- :mod:`~meshshard.io.cells`: the faces of every cell type, polyhedra's from both VTK layouts;
- :mod:`~meshshard.io.cellsizes`: exact volumes and centroids of 3-D cells, polyhedra included;
- :mod:`~meshshard.io.gmshmesh`: unstructured tetrahedral volumes from gmsh;
- :mod:`~meshshard.io.errors`: :class:`InputFileError`.
"""

from __future__ import annotations

from meshshard.io.errors import InputFileError
from meshshard.io.vtkxml import CorruptVtkXml, UnsupportedVtkXml, VtkXmlFile, read_cells

__all__ = ["CorruptVtkXml", "InputFileError", "UnsupportedVtkXml", "VtkXmlFile", "read_cells"]
