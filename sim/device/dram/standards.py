"""The DRAM standards the protocol model knows, one timing file each.

A standard's timing file (a module here) gives its ``NAME``, the table a preset writes
under ``[dram.timing]`` (``TimingConfig``, whose ``standard`` key names it; a table
without the key is LPDDR4X), ``to_cycles(dram)`` (the table in whole cycles with the
command spacings of its rules: a :class:`~sim.device.dram.cycles.ProtocolTiming`) and
``GRADES``, the sourced values of its speed grades by name. A new standard is a new
timing file and one line in :data:`STANDARDS`; nothing else in the device changes.
"""

from __future__ import annotations

import copy
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import WrapValidator

from sim.device.dram import lpddr4x, lpddr5
from sim.device.dram.cycles import Grade, ProtocolTiming

if TYPE_CHECKING:
    from sim.device.hw import DramConfig

#: The timing file of each standard, by the name a ``[dram.timing]`` table gives as
#: ``standard`` (the first is the default).
STANDARDS: dict[str, ModuleType] = {m.NAME: m for m in (lpddr4x, lpddr5)}
DEFAULT_STANDARD = next(iter(STANDARDS))


def standard_of(table: Any) -> str:
    """The standard a ``[dram.timing]`` table (a dict, or a validated table) is of."""
    if isinstance(table, dict):
        return table.get("standard", DEFAULT_STANDARD)
    return getattr(table, "standard", DEFAULT_STANDARD)


def _timing_table(table: Any, _union: Any) -> Any:
    """Validate a ``[dram.timing]`` table as its standard's ``TimingConfig``. Dispatched
    here rather than by a pydantic tagged union, whose errors would put the tag in the
    field's path (``dram.timing.lpddr4x.trcd_ns``) once there are two standards; the union
    stays the field's type for serialising (a wrap validator that never calls it)."""
    name = standard_of(table)
    if not isinstance(name, str) or name not in STANDARDS:
        raise ValueError(f"standard: unknown DRAM standard {name!r}; valid: "
                         f"{', '.join(STANDARDS)}")
    return STANDARDS[name].TimingConfig.model_validate(table)


#: The ``[dram.timing]`` table of any standard: the standard's own ``TimingConfig``, chosen
#: by the table's ``standard`` key; errors name ``dram.timing.<field>``.
DramTiming = Annotated[Union[tuple(m.TimingConfig for m in STANDARDS.values())],  # noqa: UP007
                       WrapValidator(_timing_table)]


def grade_names() -> list[str]:
    return sorted(g for m in STANDARDS.values() for g in m.GRADES)


def grade(name: str) -> Grade:
    """A named speed grade of any standard, its sources and assumptions keyed as in a
    preset (``dram.timing.FIELD``)."""
    for m in STANDARDS.values():
        if name in m.GRADES:
            g = m.GRADES[name]
            return Grade(copy.deepcopy(dict(g.table)),
                         {f"dram.timing.{k}": v for k, v in g.sources.items()},
                         {f"dram.timing.{k}": v for k, v in g.assumptions.items()})
    raise KeyError(name)


def timing_from_config(dram: DramConfig) -> ProtocolTiming:
    """``dram``'s ``[dram.timing]`` in whole cycles, by its standard's rules."""
    if dram.timing is None:
        raise ValueError("dram.timing: this hardware has no [dram.timing] table; the protocol "
                         "model needs one (see the aries preset)")
    return STANDARDS[standard_of(dram.timing)].to_cycles(dram)
