"""Placement of generators, reward scorers and learners: in-process or Ray actors (docs/distributed.md).

Importing this package never imports ray; only RayPlacement (distributed.placement=ray) and the
data-parallel learners do.
"""

from rlvr.distributed.placement import LocalPlacement, Placement, build_placement

__all__ = ["LocalPlacement", "Placement", "build_placement"]
