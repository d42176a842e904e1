"""Which files and fields a dataset has, and how its fields are made dimensionless.

:data:`DRIVAERML` describes DrivaerML (``run_i/boundary_i.vtp``, ``volume_i.vtu``,
``drivaer_i.stl``); build another :class:`DatasetSchema` for other datasets with the same shape
(a surface ``.vtp``, a volume ``.vtu``, an optional ``.stl`` per run directory).

Non-dimensionalisation follows the conventions DrivaerML users know from PhysicsNeMo's DoMINO
pipeline: surface pressure and wall shear stress ``/ (rho U_inf^2)``; volume velocity
``/ U_inf``, pressure ``/ (rho U_inf^2)``, turbulent viscosity ``/ (U_inf L)`` with ``L`` the
body length along x taken from the STL. DrivaerML's OpenFOAM pressures are kinematic
(``p / rho``), hence the default ``rho = 1``: keep ``rho = 1`` for any incompressible OpenFOAM
case (its ``p`` and ``wallShearStress`` are kinematic too; the solver's ``forces`` multiplies
them by ``rhoInf``, which cancels in the coefficients), and give the density only for fields
in pascals.

Field names. A solver's own names map onto the schema's with :meth:`DatasetSchema.with_fields`
(``{"p": "pMeanTrim", "wallShearStress": "wallShearStressMeanTrim", ...}``, file name ->
schema name; :data:`FIELD_PRESETS` ``"openfoam"`` is that map for OpenFOAM's names): the file's
array is read under the schema's name, so stores, model files and reports use one vocabulary.

Conventions (:mod:`~meshshard.datasets.conventions`): ``normals`` says which way the surface
file's cell normals point (``"auto"``: from the closed surface's signed volume) and ``shear``
which side's stress its wall shear is; data is held in OpenFOAM's (normals into the body,
shear on the fluid).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from meshshard.datasets.conventions import check_conventions

__all__ = ["DRIVAERML", "FIELD_PRESETS", "KINDS", "DatasetSchema", "FieldSpec",
           "parse_field_map"]

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
    source : str, optional
        The array's name in the file when it differs from ``name`` (``"p"`` for
        ``pMeanTrim``): read under ``source``, stored and reported as ``name``.
    """

    name: str
    kind: str
    components: int = 1
    required: bool = True
    source: str | None = None

    @property
    def array(self) -> str:
        """The array name in the file."""
        return self.source or self.name

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
    #: which way the surface file's normals point: auto (signed volume), into_body, out_of_body
    normals: str = "auto"
    #: which side's stress the file's wall shear is: on_fluid (OpenFOAM) or on_body
    shear: str = "on_fluid"

    def __post_init__(self) -> None:
        check_conventions(self.normals, self.shear)
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
                    f"({self.stl_file.format(i='<i>')}) or give one (preprocess --length, "
                    "DatasetSchema(length=...))"
                )
                raise ValueError(msg)
            return self.u_inf * length
        return 1.0

    def with_fields(self, mapping: Mapping[str, str] | str | None) -> DatasetSchema:
        """This schema reading the file arrays named by ``mapping`` (file name -> schema
        name, or a ``"p=pMeanTrim,..."`` string, or a :data:`FIELD_PRESETS` name).

        Raises
        ------
        ValueError
            A schema name the schema does not have, or a file name given twice.
        """
        if mapping is None:
            return self
        if isinstance(mapping, str):
            mapping = parse_field_map(mapping)
        to_file = {v: k for k, v in mapping.items()}
        if len(to_file) != len(mapping):
            msg = f"field map {dict(mapping)}: two file fields map to the same schema field"
            raise ValueError(msg)
        known = {f.name for f in (*self.surface_fields, *self.volume_fields)}
        unknown = sorted(set(to_file) - known)
        if unknown:
            msg = (f"field map: {unknown} are not fields of the {self.name} schema; map a file "
                   f"field onto one of {sorted(known)} (FILE=SCHEMA)")
            raise ValueError(msg)

        def remap(specs: tuple[FieldSpec, ...]) -> tuple[FieldSpec, ...]:
            return tuple(replace(f, source=to_file.get(f.name, f.source)) for f in specs)

        return replace(self, surface_fields=remap(self.surface_fields),
                       volume_fields=remap(self.volume_fields))

    def to_json(self) -> dict:
        """JSON-serialisable description (stored in every zarr's attrs)."""
        return {
            "name": self.name,
            "surface_fields": [[f.name, f.kind, f.components] for f in self.surface_fields],
            "volume_fields": [[f.name, f.kind, f.components] for f in self.volume_fields],
            "u_inf": self.u_inf,
            "rho": self.rho,
            "length": self.length,
            "normals": self.normals,
            "shear": self.shear,
            "field_sources": {f.name: f.source for f in (*self.surface_fields,
                                                         *self.volume_fields) if f.source},
        }


DRIVAERML = DatasetSchema()

#: named field maps (file name -> schema name) for :meth:`DatasetSchema.with_fields`
FIELD_PRESETS: dict[str, dict[str, str]] = {
    "openfoam": {"p": "pMeanTrim", "wallShearStress": "wallShearStressMeanTrim",
                 "U": "UMeanTrim", "nut": "nutMeanTrim"},
}


def parse_field_map(text: str) -> dict[str, str]:
    """``"p=pMeanTrim,U=UMeanTrim"`` (file name = schema name, comma-separated) or a preset
    name of :data:`FIELD_PRESETS` as a dict.

    Raises
    ------
    ValueError
        An entry that is not ``FILE=SCHEMA``, or a file name given twice.
    """
    text = text.strip()
    if text in FIELD_PRESETS:
        return dict(FIELD_PRESETS[text])
    out: dict[str, str] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        src, eq, dst = (x.strip() for x in item.partition("="))
        if not (eq and src and dst):
            msg = (f"--fields {text!r}: {item!r} is not FILE=SCHEMA (e.g. p=pMeanTrim), nor a "
                   f"preset ({', '.join(FIELD_PRESETS)})")
            raise ValueError(msg)
        if src in out:
            msg = f"--fields {text!r}: the file field {src!r} is given twice"
            raise ValueError(msg)
        out[src] = dst
    if not out:
        msg = f"--fields {text!r}: empty; give FILE=SCHEMA pairs or a preset"
        raise ValueError(msg)
    return out
