"""Checkpoints: full (unsplit) variable values in ``.npz`` plus JSON metadata.

Values are stored whole, as :meth:`VariableStore.to_dict` exports them, so a
checkpoint written under one mesh and layout loads under any other.  A
directory holds ``ckpt-000100.npz`` / ``ckpt-000100.json`` pairs and a
``latest`` file naming the newest; writes go to a temporary name first and are
renamed, so a crash never leaves a half-written checkpoint as the latest.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtf_core.errors import SerializationError

FORMAT = "mtf-planner-checkpoint/1"


@dataclass
class Checkpoint:
    """A loaded checkpoint: variable values by name, step and metadata."""

    path: Path
    step: int
    values: dict[str, np.ndarray]
    metadata: dict[str, Any]


def _name(step: int) -> str:
    return f"ckpt-{step:06d}"


def save_checkpoint(
    directory: str | Path,
    step: int,
    values: dict[str, np.ndarray],
    metadata: dict[str, Any] | None = None,
    keep: int = 3,
) -> Path:
    """Writes ``values`` and ``metadata`` as checkpoint ``step``; keeps the
    newest ``keep`` checkpoints.  Returns the path of the ``.npz`` file."""
    # A negative step wrote "ckpt--00001", whose name no later save could
    # read back (each then failed pruning); a float failed half-way.
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise SerializationError(
            f"checkpoint step is {step!r}; expected an integer >= 0"
        )
    step = int(step)
    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise SerializationError(
            f"checkpoint directory {str(d)!r} is a file; expected a directory"
        )
    d.mkdir(parents=True, exist_ok=True)
    base = d / _name(step)
    meta = {"format": FORMAT, "step": int(step), **(metadata or {})}
    # np.savez would turn "a/b" keys into nested names: store a key index.
    keys = sorted(values)
    arrays = {f"v{i}": np.asarray(values[k]) for i, k in enumerate(keys)}
    meta["variables"] = {
        k: {"shape": list(arrays[f"v{i}"].shape), "dtype": str(arrays[f"v{i}"].dtype)}
        for i, k in enumerate(keys)
    }
    meta["keys"] = keys
    tmp_npz = base.with_suffix(".npz.tmp")
    with open(tmp_npz, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub: **kwds: ArrayLike
    os.replace(tmp_npz, base.with_suffix(".npz"))
    tmp_json = base.with_suffix(".json.tmp")
    tmp_json.write_text(json.dumps(meta, indent=1, sort_keys=True))
    os.replace(tmp_json, base.with_suffix(".json"))
    tmp_latest = d / "latest.tmp"
    tmp_latest.write_text(_name(step) + "\n")
    os.replace(tmp_latest, d / "latest")
    _prune(d, keep)
    return base.with_suffix(".npz")


def _prune(d: Path, keep: int) -> None:
    steps = sorted(int(p.stem.split("-")[1]) for p in d.glob("ckpt-*.json"))
    for s in steps[:-keep] if keep > 0 else []:
        for suffix in (".npz", ".json"):
            (d / _name(s)).with_suffix(suffix).unlink(missing_ok=True)


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The ``.npz`` path of the newest checkpoint in ``directory``, or None."""
    d = Path(directory)
    marker = d / "latest"
    if not marker.exists():
        return None
    path = d / (marker.read_text().strip() + ".npz")
    return path if path.exists() else None


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Loads a checkpoint from its ``.npz`` path or from a directory (latest)."""
    p = Path(path)
    if p.is_dir():
        found = latest_checkpoint(p)
        if found is None:
            raise SerializationError(f"no checkpoint in directory {str(p)!r}")
        p = found
    meta_path = p.with_suffix(".json")
    if not p.exists() or not meta_path.exists():
        raise SerializationError(
            f"checkpoint {str(p)!r} is incomplete: expected {p.name} and "
            f"{meta_path.name}"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT:
        raise SerializationError(
            f"checkpoint {str(p)!r} has format {meta.get('format')!r}; "
            f"expected {FORMAT!r}"
        )
    with np.load(p) as z:
        values = {k: z[f"v{i}"] for i, k in enumerate(meta["keys"])}
    return Checkpoint(p, int(meta["step"]), values, meta)
