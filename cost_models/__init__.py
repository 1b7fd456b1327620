"""Cost models: hardware profiles, collective times, per-op and per-layout costs.

Pure Python over :mod:`mtf_core` (never TensorFlow).  The entry points:

* :func:`get_hardware` / :data:`PRESETS`: hardware profiles;
* :func:`evaluate`: the exact cost of one layout (time, collectives, memory);
* :func:`cost_units` / :func:`unit_cost`: the same cost cut into small pieces
  for the layout planner's integer program;
* :func:`memory_model`: tensors and live sets for per-device memory.
"""

from cost_models.collectives import (
    allgather_time_s,
    allreduce_time_s,
    alltoall_time_s,
    broadcast_time_s,
    collective_buffer_bytes,
    collective_time_s,
    shift_time_s,
)
from cost_models.costs import Cost, evaluate, layout_context
from cost_models.hardware import (
    PRESETS,
    CostModelError,
    HardwareError,
    HardwareProfile,
    LinkSpec,
)
from cost_models.memory import MemoryModel, TensorInfo, describe_overflow, memory_model
from cost_models.profiles import get_hardware
from cost_models.units import (
    CostUnit,
    UnitClass,
    UnitCost,
    UnitPricer,
    cost_unit_classes,
    cost_units,
    unit_cost,
)
