"""Seeds the store with plans for the example models (``make run`` does this).

Requests go through the service's own path (spec, cache, worker process,
store), so a seeded plan is exactly what POST /v1/plans would have stored;
seeding again finds them cached and solves nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from api.examples import example_graph
from api.metrics import Metrics
from api.schemas import PlanRequest
from api.service import PlannerService
from api.settings import Settings
from api.store import PlanRecord, open_store

_LM = dict(
    layers=2,
    d_model=1024,
    heads=16,
    d_kv=64,
    d_ff=4096,
    vocab=32000,
    length=512,
    batch=64,
)
_ENC_DEC = dict(
    layers=1,
    d_model=512,
    heads=8,
    d_kv=64,
    d_ff=2048,
    vocab=16000,
    length=256,
    batch=32,
)

#: (model, sizes, request fields): each is one seeded plan.
SEEDS: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("transformer-lm", _LM, {"mesh_shape": "x:2;y:4", "hardware": "h100-nvlink-ib"}),
    ("transformer-lm", _LM, {"num_devices": 8, "hardware": "tpu-v5e"}),
    (
        "transformer-lm",
        _LM,
        {"mesh_shape": "x:4", "hardware": "tpu-v5e", "objective": "memory"},
    ),
    # Does not fit: 1 GiB per device is far too small; the plan says by how much.
    (
        "transformer-lm",
        _LM,
        {
            "mesh_shape": "x:2;y:2",
            "hardware": "a100-nvlink-ib",
            "memory_limit_bytes": 2**30,
        },
    ),
    (
        "encoder-decoder",
        _ENC_DEC,
        {"mesh_shape": "x:4;y:2", "hardware": "a100-nvlink-ib"},
    ),
    (
        "mlp",
        dict(hidden=1024, batch=256, features=784, classes=10),
        {"mesh_shape": "x:4", "hardware": "cpu-host"},
    ),
    ("mnist", {}, {"mesh_shape": "x:2;y:2", "hardware": "cpu-host"}),
)


def seed(
    settings: Settings, say: Callable[[str], None] = print, time_limit_s: float = 30.0
) -> list[PlanRecord]:
    """Plans every :data:`SEEDS` entry not stored yet; returns all their plans."""
    # Its own instance name: starting it must not fail a running server's jobs.
    settings = settings.model_copy(
        update={"instance_name": f"{settings.instance_name}-seed"}
    )
    service = PlannerService(settings, open_store(settings), Metrics())
    service.start()
    records: list[PlanRecord] = []
    try:
        for model, sizes, fields in SEEDS:
            t0 = time.perf_counter()
            req = PlanRequest(
                graph=example_graph(model, **sizes), time_limit_s=time_limit_s, **fields
            )
            spec = service.spec(req)
            where = fields.get("mesh_shape") or f"{fields.get('num_devices')} devices"
            record = service.cached(spec)
            if record is None:
                service.validate(spec)
                _, fut = service.submit(spec)
                assert fut is not None  # nothing else submits here
                record = fut.result(timeout=time_limit_s * 20 + 120)
                how = f"planned in {time.perf_counter() - t0:.1f} s"
            else:
                how = "already stored"
            s = record.summary
            say(
                f"  {model:16s} {where:10s} {s['hardware']:15s} -> "
                f"{s['layout_rules'] or '(nothing split)'} [{s['status']}"
                f"{'' if s['fits'] else ', does not fit'}] ({how})"
            )
            records.append(record)
    finally:
        service.stop()
    return records
