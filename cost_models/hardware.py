"""Hardware profiles: what a device computes and holds, and how fast its links are.

A :class:`HardwareProfile` is a plain frozen value: per device peak flops,
memory capacity and HBM bandwidth, and the link (bandwidth and latency) each
mesh axis runs over.  Which link an axis uses is decided by
:meth:`HardwareProfile.link_for_axis`:

1. an explicit ``axis_links`` entry for the axis name wins;
2. else, with a host hierarchy (``devices_per_host``), an axis all of whose
   processor groups lie inside one host (hosts hold consecutive processor
   numbers, which are row-major over the mesh: the last axis varies fastest)
   uses ``intra_host_link``, any other axis ``inter_host_link``;
3. else ``default_link``.

Units are in the field names: bytes, bytes per second, seconds, flop/s.

>>> hw = PRESETS["h100-nvlink-ib"]
>>> hw.link_for_axis("model", "batch:4;model:8").name
'nvlink4'
>>> hw.link_for_axis("batch", "batch:4;model:8").name
'infiniband-ndr'
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cost_models.feature_names import FEATURES
from mtf_core.errors import MtfError
from mtf_core.shapes import Shape, ShapeLike, convert_to_shape


class CostModelError(MtfError, ValueError):
    """A cost-model input (collective, unit, profile) is malformed."""


class HardwareError(CostModelError):
    """A hardware profile is malformed or unknown."""


def _positive(owner: str, what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HardwareError(f"{owner}: {what} is {value!r}; expected a positive number")
    if not _finite(value) or value <= 0:
        raise HardwareError(f"{owner}: {what} is {value!r}; expected a positive number")
    return float(value)


def _finite(value: float) -> bool:
    """Not NaN or infinite, and (an int) within a float's range."""
    return abs(value) <= sys.float_info.max


@dataclass(frozen=True)
class LinkSpec:
    """A link between the devices of one mesh axis (alpha-beta model).

    ``bandwidth_bytes_per_s`` is what one device can send (one direction) to its
    ring neighbour; ``latency_s`` is the fixed cost of one message/step.
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float

    def __post_init__(self) -> None:
        owner = f"link {self.name!r}"
        object.__setattr__(
            self,
            "bandwidth_bytes_per_s",
            _positive(owner, "bandwidth_bytes_per_s", self.bandwidth_bytes_per_s),
        )
        lat = self.latency_s
        if (
            isinstance(lat, bool)
            or not isinstance(lat, (int, float))
            or not _finite(lat)
            or lat < 0
        ):
            raise HardwareError(
                f"{owner}: latency_s is {lat!r}; expected a finite number >= 0"
            )
        object.__setattr__(self, "latency_s", float(lat))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "latency_s": self.latency_s,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LinkSpec:
        _check_keys("link", d, {"name", "bandwidth_bytes_per_s", "latency_s"})
        return cls(str(d["name"]), d["bandwidth_bytes_per_s"], d["latency_s"])


def _check_keys(
    what: str, d: object, allowed: set[str], required: set[str] | None = None
) -> None:
    if not isinstance(d, Mapping):
        raise HardwareError(f"{what}: expected a mapping, got {d!r}")
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise HardwareError(
            f"{what}: unknown keys {unknown}; expected keys among {sorted(allowed)}"
        )
    missing = sorted((allowed if required is None else required) - set(d))
    if missing:
        raise HardwareError(f"{what}: missing keys {missing}")


@dataclass(frozen=True)
class HardwareProfile:
    """Per-device compute and memory, and the links mesh axes run over.

    ``axis_links`` accepts a mapping or pairs and is stored as sorted pairs.
    """

    name: str
    peak_flops: float
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    default_link: LinkSpec
    axis_links: tuple[tuple[str, LinkSpec], ...] = ()
    devices_per_host: int | None = None
    intra_host_link: LinkSpec | None = None
    inter_host_link: LinkSpec | None = None
    calibration: Calibration | None = None

    def __post_init__(self) -> None:
        owner = f"hardware {self.name!r}"
        if self.calibration is not None and not isinstance(
            self.calibration, Calibration
        ):
            raise HardwareError(
                f"{owner}: calibration is {self.calibration!r}; expected a "
                "Calibration or None"
            )
        object.__setattr__(
            self, "peak_flops", _positive(owner, "peak_flops", self.peak_flops)
        )
        mem = self.memory_bytes
        if (
            isinstance(mem, bool)
            or not isinstance(mem, (int, float))
            or not (isinstance(mem, int) or math.isfinite(mem))
            or mem < 1
        ):
            raise HardwareError(
                f"{owner}: memory_bytes is {mem!r}; expected a positive integer"
            )
        object.__setattr__(self, "memory_bytes", int(mem))
        object.__setattr__(
            self,
            "hbm_bandwidth_bytes_per_s",
            _positive(
                owner, "hbm_bandwidth_bytes_per_s", self.hbm_bandwidth_bytes_per_s
            ),
        )
        for field_name in ("default_link", "intra_host_link", "inter_host_link"):
            link = getattr(self, field_name)
            if link is None and field_name != "default_link":
                continue
            if not isinstance(link, LinkSpec):
                raise HardwareError(
                    f"{owner}: {field_name} is {link!r}; expected a LinkSpec"
                )
        pairs = (
            self.axis_links.items()
            if isinstance(self.axis_links, Mapping)
            else self.axis_links
        )
        if isinstance(pairs, str) or not isinstance(pairs, Iterable):
            raise HardwareError(
                f"{owner}: axis_links is {self.axis_links!r}; expected a mapping "
                "from mesh axis name to LinkSpec"
            )
        entries = list(pairs)
        for pair in entries:
            if (
                isinstance(pair, str)
                or not isinstance(pair, Sequence)
                or len(pair) != 2
            ):
                raise HardwareError(
                    f"{owner}: axis_links entry {pair!r}; expected an (axis name, "
                    "LinkSpec) pair"
                )
        canonical = tuple(sorted(((str(a), lk) for a, lk in entries), key=_first))
        for axis, link in canonical:
            if not isinstance(link, LinkSpec):
                raise HardwareError(
                    f"{owner}: axis_links[{axis!r}] is {link!r}; expected a LinkSpec"
                )
        if len({a for a, _ in canonical}) != len(canonical):
            raise HardwareError(f"{owner}: axis_links names an axis twice")
        object.__setattr__(self, "axis_links", canonical)
        dph = self.devices_per_host
        if dph is not None and (
            isinstance(dph, bool) or not isinstance(dph, int) or dph < 1
        ):
            raise HardwareError(
                f"{owner}: devices_per_host is {dph!r}; expected an integer >= 1"
            )

    def link_for_axis(self, axis_name: str, mesh_shape: ShapeLike) -> LinkSpec:
        """The link the processors along mesh axis ``axis_name`` talk over."""
        for a, link in self.axis_links:
            if a == axis_name:
                return link
        if self.devices_per_host is None:
            return self.default_link
        shape = convert_to_shape(mesh_shape)
        names = shape.dimension_names
        if axis_name not in names:
            raise HardwareError(
                f"mesh axis {axis_name!r} is not in mesh [{shape}]; expected one of "
                f"{names}"
            )
        sizes = tuple(d.size for d in shape)
        if _groups_fit_in_hosts(names.index(axis_name), sizes, self.devices_per_host):
            return self.intra_host_link or self.default_link
        return self.inter_host_link or self.default_link

    def slowest_link(self, axis_names: Iterable[str], mesh_shape: Any) -> LinkSpec:
        """The lowest-bandwidth link among ``axis_names`` (higher latency on ties)."""
        links = [self.link_for_axis(a, mesh_shape) for a in axis_names]
        if not links:
            raise HardwareError("slowest_link needs at least one mesh axis")
        return min(links, key=lambda lk: (lk.bandwidth_bytes_per_s, -lk.latency_s))

    def with_memory(self, memory_bytes: int) -> HardwareProfile:
        """The same profile with another per-device memory capacity."""
        return replace(self, memory_bytes=memory_bytes)

    def for_backend(self, backend: str) -> HardwareProfile:
        """The same profile priced for ``backend`` (``"placement"`` or
        ``"spmd"``); a profile without calibration is returned unchanged (the
        roofline does not tell the backends apart)."""
        if self.calibration is None:
            return self
        return replace(self, calibration=self.calibration.for_backend(backend))

    @property
    def rates(self) -> Mapping[str, float] | None:
        """The active backend's calibrated coefficients (seconds per unit of
        each feature of :mod:`cost_models.op_classes`), or None."""
        return None if self.calibration is None else self.calibration.rates

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form; :meth:`from_dict` reads it back (and calibrate writes it)."""
        return {
            "name": self.name,
            "peak_flops": self.peak_flops,
            "memory_bytes": self.memory_bytes,
            "hbm_bandwidth_bytes_per_s": self.hbm_bandwidth_bytes_per_s,
            "default_link": self.default_link.to_dict(),
            "axis_links": {a: lk.to_dict() for a, lk in self.axis_links},
            "devices_per_host": self.devices_per_host,
            "intra_host_link": _link_or_none(self.intra_host_link),
            "inter_host_link": _link_or_none(self.inter_host_link),
            **(
                {"calibration": self.calibration.to_dict()}
                if self.calibration is not None
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HardwareProfile:
        optional = {
            "axis_links",
            "devices_per_host",
            "intra_host_link",
            "inter_host_link",
            "measured",
            "calibration",
        }
        required = {
            "name",
            "peak_flops",
            "memory_bytes",
            "hbm_bandwidth_bytes_per_s",
            "default_link",
        }
        _check_keys("hardware profile", d, required | optional, required)

        def link(key: str) -> LinkSpec | None:
            v = d.get(key)
            return None if v is None else LinkSpec.from_dict(v)

        axis_links = d.get("axis_links") or {}
        if not isinstance(axis_links, Mapping):
            raise HardwareError(
                f"hardware profile: axis_links is {axis_links!r}; expected a mapping "
                "from mesh axis name to link"
            )
        return cls(
            name=str(d["name"]),
            peak_flops=d["peak_flops"],
            memory_bytes=d["memory_bytes"],
            hbm_bandwidth_bytes_per_s=d["hbm_bandwidth_bytes_per_s"],
            default_link=LinkSpec.from_dict(d["default_link"]),
            axis_links=tuple(
                (str(a), LinkSpec.from_dict(v)) for a, v in axis_links.items()
            ),
            devices_per_host=d.get("devices_per_host"),
            intra_host_link=link("intra_host_link"),
            inter_host_link=link("inter_host_link"),
            calibration=(
                None
                if d.get("calibration") is None
                else Calibration.from_dict(d["calibration"])
            ),
        )


BACKENDS = ("placement", "spmd")


_FEATURE_SET = frozenset(FEATURES)


@dataclass(frozen=True)
class Calibration:
    """Fitted per-op-class rates of a profile, per lowering backend.

    ``coefficients`` holds, per backend, seconds per unit of each feature
    named in :data:`cost_models.feature_names.FEATURES` (per-op overhead, matmul
    flops and bytes, elementwise bytes, ..., each collective kind's bytes and
    steps); ``backend`` is the one this profile prices.  Stored as sorted
    pairs so that the profile stays hashable.
    """

    backend: str
    coefficients: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]

    def __post_init__(self) -> None:
        pairs = (
            self.coefficients.items()
            if isinstance(self.coefficients, Mapping)
            else self.coefficients
        )
        canonical = []
        for backend, coefs in pairs:
            if backend not in BACKENDS:
                raise HardwareError(
                    f"calibration: backend {backend!r}; expected one of {BACKENDS}"
                )
            items = coefs.items() if isinstance(coefs, Mapping) else coefs
            clean = []
            for k, v in items:
                if k not in _FEATURE_SET:
                    raise HardwareError(
                        f"calibration[{backend!r}] has a rate for {k!r}, which is no "
                        f"feature; expected some of {sorted(_FEATURE_SET)}"
                    )
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise HardwareError(
                        f"calibration[{backend!r}][{k!r}] is {v!r}; expected a "
                        "finite number >= 0"
                    )
                if not math.isfinite(v) or v < 0:
                    raise HardwareError(
                        f"calibration[{backend!r}][{k!r}] is {v!r}; expected a "
                        "finite number >= 0"
                    )
                clean.append((str(k), float(v)))
            canonical.append((str(backend), tuple(sorted(clean))))
        canonical.sort()
        if not canonical:
            raise HardwareError("calibration: no backend has coefficients")
        object.__setattr__(self, "coefficients", tuple(canonical))
        if self.backend not in dict(canonical):
            raise HardwareError(
                f"calibration: backend {self.backend!r} has no coefficients; "
                f"calibrated backends are {[b for b, _ in canonical]}"
            )
        # Looked up once per op and layout by the pricing: kept as a dict (not
        # a field, so equality and hashing stay the coefficients').
        object.__setattr__(self, "_rates", dict(dict(canonical)[self.backend]))

    @property
    def rates(self) -> Mapping[str, float]:
        rates: Mapping[str, float] = self.__dict__["_rates"]
        return rates

    def for_backend(self, backend: str) -> Calibration:
        return Calibration(backend, self.coefficients)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "coefficients": {b: dict(c) for b, c in self.coefficients},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        _check_keys("calibration", d, {"backend", "coefficients"})
        coefs = d["coefficients"]
        if not isinstance(coefs, Mapping) or not all(
            isinstance(v, Mapping) for v in coefs.values()
        ):
            raise HardwareError(
                f"calibration: coefficients is {coefs!r}; expected a mapping from "
                "backend to a mapping from feature name to seconds per unit"
            )
        return cls(str(d["backend"]), tuple(coefs.items()))


@functools.lru_cache(maxsize=4096)
def _groups_fit_in_hosts(axis: int, sizes: tuple[int, ...], per_host: int) -> bool:
    """Whether every processor group along ``axis`` lies inside one host, hosts
    holding ``per_host`` consecutive processor numbers (row-major pnums)."""
    stride = math.prod(sizes[axis + 1 :])
    span = stride * (sizes[axis] - 1)
    total = math.prod(sizes)
    for first in range(total):
        if (first // stride) % sizes[axis]:
            continue  # not coordinate 0 along the axis
        if first // per_host != (first + span) // per_host:
            return False
    return True


def _first(pair: tuple[str, object]) -> str:
    return pair[0]


def _link_or_none(link: LinkSpec | None) -> dict[str, Any] | None:
    return None if link is None else link.to_dict()


# -- presets -------------------------------------------------------------------
# Link bandwidths are one direction per device, which is what the ring formulas
# need; vendors usually quote the bidirectional total (twice as much).
GB = 1e9
GIB = 2**30

# NVIDIA H100 SXM5 datasheet: 989 TFLOP/s dense BF16 (1,979 with sparsity),
# 80 GB HBM3 at 3.35 TB/s, NVLink 4 at 900 GB/s bidirectional per GPU (450 one
# way), 8 GPUs per HGX node; one ConnectX-7 NDR 400 Gb/s (50 GB/s) NIC per GPU.
_NVLINK4 = LinkSpec("nvlink4", 450 * GB, 3e-6)
_IB_NDR = LinkSpec("infiniband-ndr", 50 * GB, 6e-6)
# NVIDIA A100 SXM4 datasheet: 312 TFLOP/s dense BF16, 80 GB HBM2e at 2.04 TB/s,
# NVLink 3 at 600 GB/s bidirectional (300 one way); HDR 200 Gb/s (25 GB/s) NICs.
_NVLINK3 = LinkSpec("nvlink3", 300 * GB, 3e-6)
_IB_HDR = LinkSpec("infiniband-hdr", 25 * GB, 6e-6)
# Google Cloud TPU docs (system architecture): v4 has 275 TFLOP/s BF16, 32 GiB
# HBM2 at 1.2 TB/s and 6 ICI links (3-D torus, 2,400 Gb/s per chip in all), so
# an axis (2 links) moves ~100 GB/s; v5e has 197 TFLOP/s BF16, 16 GiB HBM2 at
# 819 GB/s and 4 ICI links (2-D torus, 1,600 Gb/s per chip), ~100 GB/s per axis.
_ICI_V4 = LinkSpec("ici-v4", 100 * GB, 1e-6)
_ICI_V5E = LinkSpec("ici-v5e", 100 * GB, 1e-6)
# The 2-core, 23 GB CI host split into 8 logical TensorFlow CPU devices, as
# `python -m mtf_core.lowering.calibrate --devices 8` measured it (rounded):
# 112 GFLOP/s float32 matmul (TF uses both cores for one device), 5.6 GB/s
# elementwise, placed allreduces fitting 0.94 GB/s + 14 us per ring step, and
# 2.9 GiB of RAM per device.
_CPU_LOCAL = LinkSpec("cpu-local", 1.0 * GB, 15e-6)

PRESETS: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile(
            name="h100-nvlink-ib",
            peak_flops=989e12,
            memory_bytes=80 * GIB,
            hbm_bandwidth_bytes_per_s=3.35e12,
            default_link=_NVLINK4,
            devices_per_host=8,
            intra_host_link=_NVLINK4,
            inter_host_link=_IB_NDR,
        ),
        HardwareProfile(
            name="a100-nvlink-ib",
            peak_flops=312e12,
            memory_bytes=80 * GIB,
            hbm_bandwidth_bytes_per_s=2.04e12,
            default_link=_NVLINK3,
            devices_per_host=8,
            intra_host_link=_NVLINK3,
            inter_host_link=_IB_HDR,
        ),
        HardwareProfile(
            name="tpu-v4",
            peak_flops=275e12,
            memory_bytes=32 * GIB,
            hbm_bandwidth_bytes_per_s=1.2e12,
            default_link=_ICI_V4,
        ),
        HardwareProfile(
            name="tpu-v5e",
            peak_flops=197e12,
            memory_bytes=16 * GIB,
            hbm_bandwidth_bytes_per_s=819 * GB,
            default_link=_ICI_V5E,
        ),
        HardwareProfile(
            name="cpu-host",
            peak_flops=100e9,
            memory_bytes=3 * GIB,
            hbm_bandwidth_bytes_per_s=5.5 * GB,
            default_link=_CPU_LOCAL,
        ),
    )
}


def mesh_axis_sizes(mesh_shape: ShapeLike) -> dict[str, int]:
    """``{axis name: size}`` of a mesh shape (string or Shape)."""
    shape: Shape = convert_to_shape(mesh_shape)
    return {d.name: d.size for d in shape}
