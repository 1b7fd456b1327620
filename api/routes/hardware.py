"""``/v1/hardware``: the hardware presets a request may name."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.schemas import HardwareList
from cost_models.hardware import PRESETS

router = APIRouter(prefix="/v1", tags=["hardware"])


@router.get("/hardware", response_model=HardwareList, summary="Hardware presets")
def list_hardware() -> dict[str, Any]:
    """Every preset's profile (flops, memory, links), by name."""
    return {"presets": {name: hw.to_dict() for name, hw in sorted(PRESETS.items())}}
