"""Transformer language model and encoder-decoder over named dims.

Dimension names: ``batch, length, d_model, heads, d_kv, d_ff, vocab`` (and
``memory_length`` for attention keys).  These are the names layout rules and
presets refer to: ``batch:all`` is data parallelism,
``d_ff:all;heads:all;vocab:all`` Mesh TensorFlow's model parallelism.

>>> cfg = TransformerConfig(num_layers=1, d_model=8, heads=2, d_kv=4, d_ff=16,
...                         vocab=32, length=8, batch=2)
>>> model = build_lm(cfg, optimizer="sgd")
>>> [t.name for t in model.placeholders]
['inputs:0', 'targets:0']
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mtf_core import dtypes, layers
from mtf_core.errors import ConfigError, DTypeError
from mtf_core.graph import Graph, Mesh, Tensor
from mtf_core.models.base import ModelGraph, add_training, positive_int
from mtf_core.models.moe import moe_feed_forward
from mtf_core.ops import elementwise as ew
from mtf_core.ops import reduce as red
from mtf_core.ops.creation import placeholder
from mtf_core.ops.reshape import rename_dimension
from mtf_core.ops.stored import slot_names, stored_names
from mtf_core.optimize import Optimizer
from mtf_core.recompute import recompute_block
from mtf_core.shapes import Dimension, Shape

#: Recomputation options per block class (see TransformerConfig).
RECOMPUTE_ATTENTION = ("none", "block", "scores")
RECOMPUTE_FFN = ("none", "block")

_ACTIVATIONS = {"relu": ew.relu, "gelu": ew.gelu, "silu": ew.silu}
_NORMS = {"layer_norm": layers.layer_norm, "rms_norm": layers.rms_norm}


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes and options of a Transformer (pre-norm, learned positions).

    Mixed precision: ``activation_dtype="bfloat16"`` computes (matmuls,
    activations, their gradients and collectives) in bfloat16 while weights and
    optimizer slots stay in ``master_dtype`` (float32); logits are cast to
    float32 for the loss.  ``shardable_weights=True`` stores every weight with
    ``d_model`` and another dim under a per-class storage name
    (``d_model_stored_<class>``, class ``self_attention``, ``encdec_attention``,
    ``ffn``, ``embedding`` or ``logits``) that a layout rule may put on the data
    axis: ZeRO/FSDP sharding, see :mod:`mtf_core.ops.stored`.
    ``shardable_slots=True`` also updates those weights under a per-class slot
    name (``d_model_slots_<class>``): a layout rule putting it on the data axis
    shards only the optimizer's work and slots (ZeRO-1, Megatron-LM's
    distributed optimizer; the weight stays whole, nothing is gathered on read).

    Recomputation (activation checkpointing), per block class:
    ``recompute_attention`` is ``"none"`` (keep every activation), ``"block"``
    (keep only each attention block's input; run the block again in the
    backward pass) or ``"scores"`` (recompute only the attention
    probabilities, Megatron's selective recomputation); ``recompute_ffn`` is
    ``"none"`` or ``"block"``.  Not with dropout (a recomputed mask would
    differ).

    ``experts > 0`` makes every feed-forward layer a top-1 mixture of that many
    experts (:mod:`mtf_core.models.moe`; ``experts:dp`` puts them on the data
    axis).
    """

    num_layers: int = 2
    d_model: int = 32
    heads: int = 4
    d_kv: int = 8
    d_ff: int = 64
    vocab: int = 64
    length: int = 16
    batch: int = 8
    dropout_rate: float = 0.0
    z_loss: float = 0.0
    label_smoothing: float = 0.0
    activation: str = "relu"
    norm: str = "layer_norm"
    activation_dtype: str = "float32"
    master_dtype: str = "float32"
    shardable_weights: bool = False
    shardable_slots: bool = False
    recompute_attention: str = "none"
    recompute_ffn: str = "none"
    experts: int = 0
    expert_capacity_factor: float = 1.25

    def __post_init__(self) -> None:
        for f in (
            "dropout_rate",
            "z_loss",
            "label_smoothing",
            "expert_capacity_factor",
        ):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ConfigError(f"{f} must be a number, got {v!r}")
            object.__setattr__(self, f, float(v))  # numpy floats too
        for f in ("activation", "norm"):
            if not isinstance(getattr(self, f), str):
                raise ConfigError(f"{f} must be a string, got {getattr(self, f)!r}")
        if (
            isinstance(self.experts, bool)
            or not isinstance(self.experts, numbers.Integral)
            or (self.experts < 0)
        ):
            raise ConfigError(f"experts must be an integer >= 0, got {self.experts!r}")
        object.__setattr__(self, "experts", int(self.experts))  # numpy ints too
        if not 0 < self.expert_capacity_factor < math.inf:
            raise ConfigError(
                "expert_capacity_factor must be a finite number > 0, got "
                f"{self.expert_capacity_factor!r}"
            )
        for f, allowed in (
            ("recompute_attention", RECOMPUTE_ATTENTION),
            ("recompute_ffn", RECOMPUTE_FFN),
        ):
            if getattr(self, f) not in allowed:
                raise ConfigError(
                    f"{f} {getattr(self, f)!r} is unknown; expected one of "
                    f"{list(allowed)}"
                )
        recomputes = (self.recompute_attention, self.recompute_ffn) != ("none",) * 2
        if recomputes and self.dropout_rate:
            raise ConfigError(
                f"recomputation with dropout_rate {self.dropout_rate!r}: a "
                "recomputed block would draw another dropout mask; use "
                "dropout_rate=0 or recompute none"
            )
        for f in ("activation_dtype", "master_dtype"):
            v = getattr(self, f)
            try:
                name = dtypes.as_dtype_name(v)
            except DTypeError:
                name = ""
            if name not in ("float32", "bfloat16", "float16"):
                raise ConfigError(
                    f"{f} {v!r} is not a training dtype; expected 'float32', "
                    "'bfloat16' or 'float16'"
                )
            object.__setattr__(self, f, name)
        for flag in ("shardable_weights", "shardable_slots"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(
                    f"{flag} must be True or False, got {getattr(self, flag)!r}"
                )
        for f in (
            "num_layers",
            "d_model",
            "heads",
            "d_kv",
            "d_ff",
            "vocab",
            "length",
            "batch",
        ):
            object.__setattr__(self, f, positive_int(f, getattr(self, f)))
        if self.activation not in _ACTIVATIONS:
            raise ConfigError(
                f"activation {self.activation!r} is unknown; expected one of "
                f"{sorted(_ACTIVATIONS)}"
            )
        if self.norm not in _NORMS:
            raise ConfigError(
                f"norm {self.norm!r} is unknown; expected one of {sorted(_NORMS)}"
            )
        for f in ("dropout_rate", "label_smoothing"):
            v = getattr(self, f)
            if not 0.0 <= v < 1.0:
                raise ConfigError(f"{f} must be in [0, 1), got {v!r}")
        if not 0 <= self.z_loss < math.inf:
            raise ConfigError(
                f"z_loss must be a finite number >= 0, got {self.z_loss!r}"
            )

    # -- named dims -------------------------------------------------------------
    @property
    def batch_dim(self) -> Dimension:
        return Dimension("batch", self.batch)

    @property
    def length_dim(self) -> Dimension:
        return Dimension("length", self.length)

    @property
    def memory_length_dim(self) -> Dimension:
        return Dimension("memory_length", self.length)

    @property
    def model_dim(self) -> Dimension:
        return Dimension("d_model", self.d_model)

    @property
    def heads_dim(self) -> Dimension:
        return Dimension("heads", self.heads)

    @property
    def kv_dim(self) -> Dimension:
        return Dimension("d_kv", self.d_kv)

    @property
    def ff_dim(self) -> Dimension:
        return Dimension("d_ff", self.d_ff)

    @property
    def vocab_dim(self) -> Dimension:
        return Dimension("vocab", self.vocab)

    @property
    def variable_dtype(self) -> dtypes.VariableDType:
        """Master and slices in ``master_dtype``, activations in ``activation_dtype``."""
        return dtypes.VariableDType(
            self.master_dtype, self.master_dtype, self.activation_dtype
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TransformerConfig:
        if not isinstance(d, Mapping):
            raise ConfigError(f"TransformerConfig data {d!r} is not a mapping")
        cls._check_fields(d)
        return cls(**d)

    def replace(self, **changes: Any) -> TransformerConfig:
        self._check_fields(changes)
        return dataclasses.replace(self, **changes)

    @classmethod
    def _check_fields(cls, names: Iterable[str]) -> None:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(names) - known)
        if unknown:
            raise ConfigError(
                f"unknown TransformerConfig field(s) {unknown}; expected some of "
                f"{sorted(known)}"
            )


# --------------------------------------------------------------------------
# building blocks
# --------------------------------------------------------------------------


#: Substrings of weight names and the storage class they belong to.
_STORAGE_CLASSES = (
    ("encdec_attention", "encdec_attention"),
    ("self_attention", "self_attention"),
    ("ffn", "ffn"),
    ("embedding", "embedding"),
    ("positions", "embedding"),
    ("logits", "logits"),
)


def storage_class(name: str) -> str | None:
    """The storage class of a weight named ``name`` (None: not shardable)."""
    base = name.rsplit("/", 1)[-1]
    return next((c for key, c in _STORAGE_CLASSES if key in base), None)


def _storage_policy(name: str, shape: Shape) -> dict[str, str]:
    # Only weights that have d_model and another dim (norm scales stay whole).
    cls = storage_class(name)
    if cls is None or shape.ndims < 2 or "d_model" not in shape.dimension_names:
        return {}
    return {"d_model": f"d_model_stored_{cls}"}


def _slot_policy(name: str, shape: Shape) -> dict[str, str]:
    stored = _storage_policy(name, shape)
    return {d: s.replace("_stored_", "_slots_", 1) for d, s in stored.items()}


def _storage(cfg: TransformerConfig, graph: Graph) -> Any:
    """Stored weight (and slot) names while building and adding training, if
    asked."""
    stack = contextlib.ExitStack()
    if cfg.shardable_weights:
        stack.enter_context(stored_names(graph, _storage_policy))
    if cfg.shardable_slots:
        stack.enter_context(slot_names(graph, _slot_policy))
    return stack


def _embed(cfg: TransformerConfig, ids: Tensor, name: str) -> Tensor:
    vd = cfg.variable_dtype
    x = layers.embedding(
        ids, cfg.vocab_dim, cfg.model_dim, vd, name=f"{name}_embedding"
    )
    pos = layers.embedding_weights(
        ids.mesh,
        cfg.length_dim,
        cfg.model_dim,
        vd,
        name=f"{name}_positions",
        stddev=0.1,
    )
    return layers.dropout(x + pos, cfg.dropout_rate)


def _norm(cfg: TransformerConfig, x: Tensor, name: str) -> Tensor:
    return _NORMS[cfg.norm](x, cfg.model_dim, name=name)


def _attend(
    cfg: TransformerConfig,
    x: Tensor,
    name: str,
    bias: Tensor | None,
    memory: Tensor | None = None,
) -> Tensor:
    def block(x: Tensor) -> Tensor:
        h = _norm(cfg, x, f"{name}_norm")
        y = layers.multihead_attention(
            h,
            cfg.heads_dim,
            cfg.kv_dim,
            memory=memory,
            bias=None if bias is None else ew.cast(bias, x.dtype),
            dropout_rate=cfg.dropout_rate,
            name=name,
            variable_dtype=cfg.variable_dtype,
            recompute_scores=cfg.recompute_attention == "scores",
        )
        return x + layers.dropout(y, cfg.dropout_rate)

    # Encoder-decoder attention reads the encoder's output too: recomputing
    # it as a block of x alone would lose that gradient, so it keeps all.
    if cfg.recompute_attention == "block" and memory is None:
        return recompute_block(block, x)
    return block(x)


def _feed_forward(cfg: TransformerConfig, x: Tensor, name: str) -> Tensor:
    def block(x: Tensor) -> Tensor:
        h = _norm(cfg, x, f"{name}_norm")
        if cfg.experts:
            y = moe_feed_forward(
                h,
                cfg.experts,
                cfg.ff_dim,
                cfg.expert_capacity_factor,
                cfg.variable_dtype,
                _ACTIVATIONS[cfg.activation],
                name=f"{name}_moe",
            )
            return x + y
        y = layers.dense_relu_dense(
            h,
            cfg.ff_dim,
            dropout_rate=cfg.dropout_rate,
            activation=_ACTIVATIONS[cfg.activation],
            master_dtype=cfg.master_dtype,
            slice_dtype=cfg.master_dtype,
            name=name,
        )
        return x + layers.dropout(y, cfg.dropout_rate)

    if cfg.recompute_ffn == "block":
        return recompute_block(block, x)
    return block(x)


def _logits_and_loss(
    cfg: TransformerConfig, x: Tensor, targets: Tensor
) -> tuple[Tensor, Tensor]:
    x = _norm(cfg, x, "final_norm")
    logits = layers.dense(
        x,
        cfg.vocab_dim,
        use_bias=False,
        master_dtype=cfg.master_dtype,
        slice_dtype=cfg.master_dtype,
        name="logits",
    )
    logits = ew.cast(logits, "float32")  # the loss in float32 (mixed precision)
    per_token = layers.sparse_softmax_cross_entropy(
        logits,
        targets,
        cfg.vocab_dim,
        z_loss=cfg.z_loss,
        label_smoothing=cfg.label_smoothing,
    )
    return logits, red.reduce_mean(per_token)


def _placeholders(
    mesh: Mesh, cfg: TransformerConfig, names: list[str]
) -> dict[str, Tensor]:
    shape = [cfg.batch_dim, cfg.length_dim]
    return {n: placeholder(mesh, shape, "int32", name=n) for n in names}


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------


def build_lm(
    config: TransformerConfig,
    optimizer: Optimizer | str | None = None,
    learning_rate: float | None = None,
    graph: Graph | None = None,
) -> ModelGraph:
    """Decoder-only Transformer language model.

    Placeholders ``inputs`` and ``targets`` are ``[batch, length]`` int32 token
    ids (``targets`` is ``inputs`` shifted left by one).  The loss is the mean
    per-token cross entropy in nats.  With an ``optimizer`` (an
    :class:`~mtf_core.optimize.Optimizer` or a name such as ``"adam"``) the
    model also carries gradients and updates.
    """
    graph = graph if graph is not None else Graph()
    mesh = Mesh(graph, "mesh")
    cfg = config
    with _storage(cfg, graph):
        ph = _placeholders(mesh, cfg, ["inputs", "targets"])
        x = _embed(cfg, ph["inputs"], "token")
        causal = layers.attention_bias_causal(
            mesh, cfg.length_dim, cfg.memory_length_dim
        )
        for i in range(cfg.num_layers):
            x = _attend(cfg, x, f"layer_{i:03d}/self_attention", causal)
            x = _feed_forward(cfg, x, f"layer_{i:03d}/ffn")
        logits, loss = _logits_and_loss(cfg, x, ph["targets"])
        model = ModelGraph(graph, mesh, ph, loss, logits, cfg)
        return add_training(model, optimizer, learning_rate)


def build_encoder_decoder(
    config: TransformerConfig,
    optimizer: Optimizer | str | None = None,
    learning_rate: float | None = None,
    graph: Graph | None = None,
    pad_id: int = 0,
) -> ModelGraph:
    """Encoder-decoder Transformer (sequence to sequence).

    Placeholders (all ``[batch, length]`` int32): ``inputs`` (encoder tokens,
    ``pad_id`` marks padding, which attention masks out), ``decoder_inputs``
    and ``targets``.  ``config.num_layers`` layers each in the encoder and the
    decoder; embeddings are not shared.
    """
    graph = graph if graph is not None else Graph()
    mesh = Mesh(graph, "mesh")
    cfg = config
    with _storage(cfg, graph):
        ph = _placeholders(mesh, cfg, ["inputs", "decoder_inputs", "targets"])
        logits, loss = encoder_decoder_loss(
            cfg, ph["inputs"], ph["decoder_inputs"], ph["targets"], pad_id
        )
        model = ModelGraph(graph, mesh, ph, loss, logits, cfg)
        return add_training(model, optimizer, learning_rate)


def encoder_decoder_loss(
    cfg: TransformerConfig,
    inputs: Tensor,
    decoder_inputs: Tensor,
    targets: Tensor,
    pad_id: int = 0,
) -> tuple[Tensor, Tensor]:
    """:func:`build_encoder_decoder`'s forward pass on one batch of
    ``[batch, length]`` token ids: its logits and mean loss.  Call it inside
    the model's weight storage policy (``_storage``); a second call reuses
    the weights by name (a pipeline's micro-batches, :mod:`mtf_core.pipeline`)."""
    mem_ids = rename_dimension(inputs, "length", "memory_length")
    padding = layers.attention_bias_padding(mem_ids, pad_id)
    x = _embed(cfg, inputs, "encoder")
    for i in range(cfg.num_layers):
        x = _attend(cfg, x, f"encoder_{i:03d}/self_attention", padding)
        x = _feed_forward(cfg, x, f"encoder_{i:03d}/ffn")
    memory = _norm(cfg, x, "encoder_final_norm")
    y = _embed(cfg, decoder_inputs, "decoder")
    causal = layers.attention_bias_causal(
        inputs.mesh, cfg.length_dim, cfg.memory_length_dim
    )
    for i in range(cfg.num_layers):
        if i:
            # Each decoder layer reads the encoder output through its own
            # identity (free: it aliases the buffer), so the backward pass
            # sums that output's gradient layer by layer as it meets the
            # layers, as frameworks accumulate it, instead of holding every
            # layer's part for one sum at the end; and every layer is the
            # same ops (layout_planner.stacked prices deep stages from a
            # few layers).
            memory = ew.identity(memory, name=f"decoder_{i:03d}/encoder_output")
        y = _attend(cfg, y, f"decoder_{i:03d}/self_attention", causal)
        y = _attend(cfg, y, f"decoder_{i:03d}/encdec_attention", padding, memory)
        y = _feed_forward(cfg, y, f"decoder_{i:03d}/ffn")
    return _logits_and_loss(cfg, y, targets)
