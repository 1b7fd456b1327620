"""Where the published layouts' memory goes in our model (docs/scale.md).

* GPT-3 175B's published layout priced with and without the distributed
  optimizer (slots-only sharding over data);
* Llama-2-70B's published stage on 64 H100: what one in-flight micro-batch
  holds, by kind of tensor (the ``[batch, length, d_model]`` ones are those
  sequence parallelism would split over the tensor axis), and the bytes of
  the attention's ``k`` and ``v`` weights and slots per device.

    .venv/bin/python bench/scale_memory.py
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.scale import CASES, DISTRIBUTED_OPTIMIZER, MEGATRON  # noqa: E402
from cost_models.memory import ACTIVATION, memory_model  # noqa: E402
from cost_models.pipeline import data_dependent  # noqa: E402
from layout_planner.choices import price_layout  # noqa: E402
from mtf_core.comm import LayoutContext  # noqa: E402
from mtf_core.models import build_lm  # noqa: E402

GIB = 2**30


def gpt3() -> None:
    case = next(c for c in CASES if c.key == "gpt3")
    for name, rules in (
        ("without the distributed optimizer", MEGATRON),
        ("with it", MEGATRON + ";" + DISTRIBUTED_OPTIMIZER),
    ):
        p = price_layout(case.config, case.published, rules, case.hardware)
        print(
            f"GPT-3 published, {name}: step {p.step_time_s:.2f} s, "
            f"peak {p.peak_memory_bytes / GIB:.1f} GiB, fits {p.fits}"
        )


def llama_held() -> None:
    case = next(c for c in CASES if c.key == "llama64")
    pub = case.published
    cfg = dataclasses.replace(
        case.config,
        num_layers=case.config.num_layers // pub.stages,
        batch=case.config.batch // pub.micro_batches,
        recompute_attention=pub.recompute_attention,
        recompute_ffn=pub.recompute_ffn,
        shardable_weights=True,
        shardable_slots=True,
    )
    model = build_lm(cfg, optimizer="adam")
    ops = model.graph.operations
    first_backward = 1 + next(i for i, o in enumerate(ops) if o is model.loss.operation)
    head = next(i for i, o in enumerate(ops) if o.name == "final_norm_scale")
    ctx = LayoutContext.make(pub.stage_mesh, case.published_rules)
    memory = memory_model(model.graph, [model.loss])
    per_batch = data_dependent(model.graph)
    sizes = memory.tensor_bytes_per_device(ctx)
    by_kind: collections.Counter[str] = collections.Counter()
    for t, kind, b, first, last in zip(
        memory.buffers, memory.kinds, sizes, memory.start, memory.end
    ):
        if kind == ACTIVATION and first < head and last >= first_backward:
            if t in per_batch:
                names = set(t.shape.dimension_names) - {"length", "memory_length"}
                by_kind[",".join(sorted(names))] += b
    print(f"Llama-2-70B published stage ({pub.stage_mesh}), held per micro-batch:")
    for k, b in by_kind.most_common():
        print(f"  {b / GIB:6.2f} GiB  [{k}, length]")
    print(f"  {sum(by_kind.values()) / GIB:6.2f} GiB  in all")
    kv = sum(
        b
        for t, kind, b in zip(memory.buffers, memory.kinds, sizes)
        if kind != ACTIVATION
        and any(f"self_attention_{w}" in t.name for w in ("k", "v"))
    )
    print(f"k and v weights and slots per device: {kv / GIB:.2f} GiB")


if __name__ == "__main__":
    print(f"load average {os.getloadavg()[0]:.1f}")
    gpt3()
    llama_held()
