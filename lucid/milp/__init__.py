"""The solver-neutral MILP: one model (`MilpModel`), a builder, and the ReLU and matching-dependency
encodings every LUCID model is made of. Nothing here knows a solver or how bounds were computed:
they come in as plain arrays (`lucid.analysis.encode` assembles Eq. 3 from them)."""

from lucid.milp.model import MilpModel

__all__ = ["MilpModel"]
