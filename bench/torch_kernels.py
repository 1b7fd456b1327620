"""Times one device's step kernels on a GPU with PyTorch (no project imports).

Reads the kernel list that ``bench/gpu_kernels.py export`` wrote (each op of
a planned stage step, at its per-device slice shapes and dtypes, once per
distinct signature, and each case's ops in step order) and measures, on the
GPU PyTorch sees:

* every distinct kernel alone: the wall time of a back-to-back batch of
  calls (at least ``--min-ms`` of work, synchronized at both ends), the
  median of ``--repeats`` batches;
* each case's whole op sequence in step order, run ``--replays`` times
  (the first left out as warm-up), inputs drawn from a pool of one buffer per
  distinct (shape, dtype), so caches see what a step shows them; where the
  case says where its once-per-step ops start (``once_at``), also its
  per-micro-batch part and its once-per-step part, each on its own.

Each op runs as the placement lowering runs it: one unfused kernel per op,
inputs aligned by dim name (transpose, then broadcast), einsums through
``torch.einsum`` (cuBLAS).  Ops the list marks ``proxy`` read their inputs
and write their output with a stand-in kernel of the same bytes: lookups,
top-k, cumsum, and the renames a stored (ZeRO) weight is read through and
its gradient reduce-scattered through, which the cost model prices as
elementwise bytes.  They are 2-6% of a case's roofline time.

    python3 bench/torch_kernels.py kernels.json measured.json

Needs only PyTorch and the standard library: it runs on a machine that has
neither TensorFlow nor this project's dependencies.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import string
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}

UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "square": torch.square,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "relu": torch.relu,
    "negative": torch.neg,
    "abs": torch.abs,
    "reciprocal": torch.reciprocal,
    "sin": torch.sin,
    "cos": torch.cos,
    "softplus": F.softplus,
    "silu": F.silu,
    "gelu": F.gelu,
    "elu": F.elu,
    "selu": F.selu,
    "sign": torch.sign,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "round": torch.round,
    "logical_not": torch.logical_not,
    "is_finite": torch.isfinite,
}

BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add,
    "sub": torch.sub,
    "multiply": torch.mul,
    "divide": torch.div,
    "minimum": torch.minimum,
    "maximum": torch.maximum,
    "pow": torch.pow,
    "less": torch.lt,
    "less_equal": torch.le,
    "greater": torch.gt,
    "greater_equal": torch.ge,
    "equal": torch.eq,
    "not_equal": torch.ne,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
    "floordiv": torch.floor_divide,
    "mod": torch.remainder,
}

#: Logical reductions (any, all) run as sums: same bytes, one kernel.
REDUCE = {
    "SUM": torch.sum,
    "MAX": torch.amax,
    "MIN": torch.amin,
}


def _align(x: torch.Tensor, dims: Sequence[str], to: Sequence[str]) -> torch.Tensor:
    """``x`` (dims ``dims``) transposed to ``to``'s order, with size-1 axes for
    the dims of ``to`` it lacks: ready to broadcast against ``to``."""
    order = [n for n in to if n in dims]
    if order != list(dims):
        x = x.permute([list(dims).index(n) for n in order])
    shape = []
    k = 0
    for n in to:
        if n in dims:
            shape.append(x.shape[k])
            k += 1
        else:
            shape.append(1)
    return x.reshape(shape)


def _equation(inputs: Sequence[dict[str, Any]], output: dict[str, Any]) -> str:
    letters: dict[str, str] = {}
    for t in [*inputs, output]:
        for n in t["dims"]:
            letters.setdefault(n, string.ascii_letters[len(letters)])

    def term(t: dict[str, Any]) -> str:
        return "".join(letters[n] for n in t["dims"])

    return ",".join(term(t) for t in inputs) + "->" + term(output)


class Pool:
    """One buffer per distinct (shape, dtype, slot), made on first use: an
    op's inputs of one shape and dtype take slots 0, 1, ... so that they are
    distinct buffers (an assignment from a buffer to itself is no copy)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers: dict[tuple[tuple[int, ...], str, int], torch.Tensor] = {}

    def get(self, t: dict[str, Any], slot: int = 0) -> torch.Tensor:
        key = (tuple(t["shape"]), t["dtype"], slot)
        got = self.buffers.get(key)
        if got is None:
            got = self.buffers[key] = make(t, self.device)
        return got

    def inputs(self, ts: Sequence[dict[str, Any]]) -> list[torch.Tensor]:
        seen: dict[tuple[tuple[int, ...], str], int] = {}
        out = []
        for t in ts:
            key = (tuple(t["shape"]), t["dtype"])
            out.append(self.get(t, seen.get(key, 0)))
            seen[key] = seen.get(key, 0) + 1
        return out

    def bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())


def make(t: dict[str, Any], device: torch.device, high: int = 2) -> torch.Tensor:
    """A tensor of ``t``'s shape and dtype: normal floats, ints in
    ``[0, high)``, random booleans."""
    dt = DTYPES[t["dtype"]]
    shape = tuple(t["shape"])
    if dt.is_floating_point:
        return torch.randn(shape, device=device, dtype=dt)
    if dt == torch.bool:
        return torch.rand(shape, device=device) > 0.5
    return torch.randint(0, max(high, 1), shape, device=device, dtype=dt)


def kernel(k: dict[str, Any], pool: Pool) -> Callable[[], Any] | None:
    """A closure running kernel ``k`` once on ``pool``'s buffers (None: the op
    makes no GPU work, a view or a variable read)."""
    kind = k["type"]
    ins = k["inputs"]
    out = k["output"] or ins[0]  # an assignment writes its variable
    od = out["dims"]
    if kind in ("Variable", "Reshape", "CustomGradient") or k["class"] == "view":
        return None
    if k.get("proxy"):
        return _proxy(k, pool)
    xs = pool.inputs(ins)
    if kind == "Einsum":
        eq = _equation(ins, out)
        return lambda: torch.einsum(eq, *xs)
    if kind == "Binary":
        fn = BINARY[k["fn"]]
        a, b = (_align(x, t["dims"], od) for x, t in zip(xs, ins))
        return lambda: fn(a, b)
    if kind == "Unary":
        fn = UNARY[k["fn"]]
        x = xs[0]
        return lambda: fn(x)
    if kind == "Cast":
        dt = DTYPES[out["dtype"]]
        x = xs[0]
        return lambda: x.to(dt)
    if kind == "Reduce":
        red = REDUCE.get(k["fn"], torch.sum)
        axes = [i for i, n in enumerate(ins[0]["dims"]) if n not in od]
        kept = [n for n in ins[0]["dims"] if n in od]
        perm = [kept.index(n) for n in od]
        x = xs[0]
        if perm == sorted(perm):
            return lambda: red(x, dim=axes)
        return lambda: red(x, dim=axes).permute(perm).contiguous()
    if kind == "AddN":
        al = [_align(x, t["dims"], od) for x, t in zip(xs, ins)]

        def add_n() -> torch.Tensor:
            acc = al[0] + al[1]
            for x in al[2:]:
                acc.add_(x)
            return acc

        return add_n
    if kind == "Broadcast":
        a = _align(xs[0], ins[0]["dims"], od)
        shape = tuple(out["shape"])
        return lambda: a.expand(shape).contiguous()
    if kind == "Assign":
        var, val = xs
        val = _align(val, ins[1]["dims"], ins[0]["dims"])
        if k["fn"] == "assign_add":
            return lambda: var.add_(val)
        if k["fn"] == "assign_sub":
            return lambda: var.sub_(val)
        return lambda: var.copy_(val)
    if kind == "Where":
        c, a, b = (_align(x, t["dims"], od) for x, t in zip(xs, ins))
        return lambda: torch.where(c, a, b)
    return _proxy(k, pool)


def _proxy(k: dict[str, Any], pool: Pool) -> Callable[[], Any]:
    """Reads every input once and writes the output: a stand-in of the same
    bytes for an op this script does not mirror."""
    xs = pool.inputs(k["inputs"])
    out = k["output"] or k["inputs"][0]
    shape = tuple(out["shape"])
    dt = DTYPES[out["dtype"]]
    dev = pool.device

    def run() -> torch.Tensor:
        for x in xs:
            x.sum()
        return torch.zeros(shape, dtype=dt, device=dev)

    return run


def time_kernel(
    fn: Callable[[], Any], sync: Callable[[], None], repeats: int, min_ms: float
) -> float:
    """Seconds per call: wall time of back-to-back batches of calls, each at
    least ``min_ms`` long (launch overhead included, as in a step), median of
    ``repeats`` batches."""
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = max(time.perf_counter() - t0, 1e-6) * 1e3
    n = max(1, min(1000, int(min_ms / once) + 1))
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


def replay(
    fns: Sequence[Callable[[], Any] | None], sync: Callable[[], None], replays: int
) -> list[float]:
    """Seconds of each timed pass over ``fns`` in order (the first of
    ``replays`` passes is warm-up and left out)."""
    out = []
    for i in range(replays):
        sync()
        t0 = time.perf_counter()
        for fn in fns:
            if fn is not None:
                fn()
        sync()
        if i:
            out.append(time.perf_counter() - t0)
    return out


def chip_rates(dev: torch.device, sync: Callable[[], None]) -> dict[str, float]:
    """The chip's best rates, for scale: an 8192^3 bfloat16 matmul (flop/s)
    and a 1 GiB device-to-device copy (bytes read + written per second)."""
    n = 8192 if dev.type == "cuda" else 512
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    mm = time_kernel(lambda: a @ b, sync, 5, 50.0)
    src = torch.empty(
        2**30 if dev.type == "cuda" else 2**24, dtype=torch.uint8, device=dev
    )
    dst = torch.empty_like(src)
    cp = time_kernel(lambda: dst.copy_(src), sync, 5, 50.0)
    return {
        "matmul_flops_per_s": 2 * n**3 / mm,
        "copy_bytes_per_s": 2 * src.numel() / cp,
    }


def check(k: dict[str, Any], got: Any) -> str | None:
    """Why a mirrored kernel's result is not the op's output (None: it is)."""
    out = k["output"]
    if out is None or k["proxy"] or not isinstance(got, torch.Tensor):
        return None
    if list(got.shape) != list(out["shape"]) or got.dtype != DTYPES[out["dtype"]]:
        return f"{k['type']} {k['fn']}: got {list(got.shape)} {got.dtype}, expected {out['shape']} {out['dtype']}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kernels", help="the JSON file gpu_kernels.py export wrote")
    ap.add_argument("out", help="where to write the measurements (JSON)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-ms", type=float, default=2.0)
    ap.add_argument("--replays", type=int, default=4)
    ap.add_argument(
        "--replay-limit-gib",
        type=float,
        default=48.0,
        help="skip a case's replay when its buffer pool would exceed this",
    )
    ap.add_argument(
        "--cpu",
        action="store_true",
        help="run on the CPU (a smoke test of this script; the figures mean nothing)",
    )
    args = ap.parse_args(argv)
    if args.cpu:
        dev = torch.device("cpu")

        def sync() -> None:
            pass

    elif torch.cuda.is_available():
        dev = torch.device("cuda")
        sync = torch.cuda.synchronize
    else:
        print("no CUDA device (use --cpu for a smoke test)", file=sys.stderr)
        return 2
    with open(args.kernels) as f:
        spec = json.load(f)
    # TensorFlow runs float32 matmuls in TF32 on Ampere and newer by default.
    torch.backends.cuda.matmul.allow_tf32 = True
    t_start = time.perf_counter()
    kernels = spec["kernels"]
    rates = chip_rates(dev, sync)
    print(
        f"  chip: {rates['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s bf16 matmul, "
        f"{rates['copy_bytes_per_s'] / 1e9:.0f} GB/s copy",
        flush=True,
    )
    seconds: list[float | None] = []
    wrong: list[str] = []
    for i, k in enumerate(kernels):
        pool = Pool(dev)
        fn = kernel(k, pool)
        if fn is not None:
            why = check(k, fn())
            if why is not None:
                wrong.append(f"kernel {i}: {why}")
                print(f"  {wrong[-1]}", flush=True)
        seconds.append(
            None if fn is None else time_kernel(fn, sync, args.repeats, args.min_ms)
        )
        del fn, pool
        if i % 25 == 0 or i == len(kernels) - 1:
            print(
                f"  kernel {i + 1}/{len(kernels)} ({time.perf_counter() - t_start:.0f} s)",
                flush=True,
            )
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    replays: dict[str, Any] = {}
    for case in spec["cases"]:
        need = case["pool_bytes"] / 2**30
        if need > args.replay_limit_gib:
            replays[case["key"]] = {"skipped": f"pool of {need:.1f} GiB"}
            continue
        pool = Pool(dev)
        fns = [kernel(kernels[i], pool) for i in case["order"]]
        passes = replay(fns, sync, args.replays)
        replays[case["key"]] = {"seconds": passes, "pool_bytes": pool.bytes()}
        split = case.get("once_at")
        if split is not None:
            # The per-micro-batch part and the once-per-step part, each
            # replayed on its own (the same buffers).
            replays[case["key"]]["parts"] = [
                replay(fns[:split], sync, args.replays),
                replay(fns[split:], sync, args.replays),
            ]
        print(
            f"  replay {case['key']}: {statistics.median(passes) * 1e3:.1f} ms",
            flush=True,
        )
        del fns, pool
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        name, memory = props.name, props.total_memory
    else:
        name, memory = f"CPU ({platform.processor() or platform.machine()})", 0
    result = {
        "device": name,
        "memory_bytes": memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "repeats": args.repeats,
        "min_ms": args.min_ms,
        "chip": rates,
        "kernel_seconds": seconds,
        "wrong_shapes": wrong,
        "replays": replays,
        "wall_s": time.perf_counter() - t_start,
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(f"wrote {args.out} ({result['wall_s']:.0f} s on {name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
