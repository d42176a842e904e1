"""Which files and fields a dataset has, and how its fields are made dimensionless.

:data:`DRIVAERML` describes DrivaerML (``run_i/boundary_i.vtp``, ``volume_i.vtu``,
``drivaer_i.stl``); build another :class:`DatasetSchema` for other datasets with the same shape
(a surface ``.vtp``, a volume ``.vtu``, an optional ``.stl`` per run directory).

Non-dimensionalisation follows the conventions DrivaerML users know from PhysicsNeMo's DoMINO
pipeline: surface pressure and wall shear stress ``/ (rho U_inf^2)``; volume velocity
``/ U_inf``, pressure ``/ (rho U_inf^2)``, turbulent viscosity ``/ (U_inf L)`` with ``L`` the
body length along x taken from the STL. DrivaerML's OpenFOAM pressures are kinematic
(``p / rho``), hence the default ``rho = 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DRIVAERML", "KINDS", "DatasetSchema", "FieldSpec"]

#: field kind -> how it is scaled (see :meth:`DatasetSchema.scale`)
KINDS = ("pressure", "wall_shear", "velocity", "nut", "coefficient", "raw")


@dataclass(frozen=True)
class FieldSpec:
    """One cell-data array of a run file.

    Attributes
    ----------
    name : str
        Array name in the VTK file (e.g. ``"pMeanTrim"``).
    kind : str
        One of :data:`KINDS`; decides the non-dimensional scale.
    components : int
        1 for scalars, 3 for vectors.
    required : bool
        A missing required field is an error; a missing optional one is skipped.
    """

    name: str
    kind: str
    components: int = 1
    required: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            msg = f"FieldSpec {self.name!r}: kind={self.kind!r} is not one of {KINDS}"
            raise ValueError(msg)
        if self.components < 1:
            msg = f"FieldSpec {self.name!r}: components={self.components} must be >= 1"
            raise ValueError(msg)


@dataclass(frozen=True)
class DatasetSchema:
    """File layout, field names and reference values of a dataset of CFD runs.

    File names are templates formatted with ``i`` (the run index parsed from the run directory
    name ``run_<i>``).
    """

    name: str = "drivaerml"
    run_prefix: str = "run_"
    surface_file: str = "boundary_{i}.vtp"
    volume_file: str = "volume_{i}.vtu"
    stl_file: str = "drivaer_{i}.stl"
    surface_fields: tuple[FieldSpec, ...] = field(
        default_factory=lambda: (
            FieldSpec("pMeanTrim", "pressure", 1),
            FieldSpec("wallShearStressMeanTrim", "wall_shear", 3),
            FieldSpec("CpMeanTrim", "coefficient", 1, required=False),
        )
    )
    volume_fields: tuple[FieldSpec, ...] = field(
        default_factory=lambda: (
            FieldSpec("UMeanTrim", "velocity", 3),
            FieldSpec("pMeanTrim", "pressure", 1),
            FieldSpec("nutMeanTrim", "nut", 1),
        )
    )
    u_inf: float = 38.889
    rho: float = 1.0
    #: body length for ``nut`` scaling; None takes the STL's extent along x
    length: float | None = None

    def __post_init__(self) -> None:
        if not (self.u_inf > 0 and self.rho > 0):
            msg = f"u_inf={self.u_inf} and rho={self.rho} must both be > 0"
            raise ValueError(msg)
        if self.length is not None and not self.length > 0:
            msg = f"length={self.length} must be > 0 (or None to take it from the STL)"
            raise ValueError(msg)

    def scale(self, kind: str, length: float | None) -> float:
        """The factor a field of ``kind`` is divided by.

        Raises
        ------
        ValueError
            For ``kind="nut"`` when no length is known.
        """
        q = self.rho * self.u_inf**2
        if kind in ("pressure", "wall_shear"):
            return q
        if kind == "velocity":
            return self.u_inf
        if kind == "nut":
            if length is None:
                msg = (
                    "nut needs a length scale: provide the run's STL file "
                    f"({self.stl_file}) or set DatasetSchema(length=...)"
                )
                raise ValueError(msg)
            return self.u_inf * length
        return 1.0

    def to_json(self) -> dict:
        """JSON-serialisable description (stored in every zarr's attrs)."""
        return {
            "name": self.name,
            "surface_fields": [[f.name, f.kind, f.components] for f in self.surface_fields],
            "volume_fields": [[f.name, f.kind, f.components] for f in self.volume_fields],
            "u_inf": self.u_inf,
            "rho": self.rho,
            "length": self.length,
        }


DRIVAERML = DatasetSchema()
