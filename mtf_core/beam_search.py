"""Decoding with a model's next-token logits: ``beam_search`` (beam search
with GNMT length penalties) and ``greedy_decode`` (argmax or sampling), with
Mesh TensorFlow's signatures and meanings.

Both are mtf graphs: one :func:`mtf_core.ops.control.while_loop` whose body
calls ``logits_fn`` (the model) once per position, so decoding lowers under
any layout of the model.  Sequences are ``[batch, beam, length]`` int32 ids,
0 past the decoded positions; id ``eos_id`` ends a sequence.

Beam search keeps two sets of ``beam`` sequences per example: *alive* ones,
still growing, and *finished* ones, which ended in EOS.  Each step extends
every alive sequence by every token, keeps the ``2 * beam`` best extensions
(so that ``beam`` of them are alive even if up to ``beam`` end in EOS), takes
the best ``beam`` non-finished into *alive* and merges the finished ones into
*finished*.  Scores are log probabilities divided by the length penalty
``((5 + length) / 6) ** alpha``.  With ``stop_early`` it stops when no alive
sequence can beat the worst finished one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.errors import ArgumentError, ShapeError
from mtf_core.graph import Tensor
from mtf_core.ops import elementwise as ew
from mtf_core.ops import reduce as red
from mtf_core.ops.control import while_loop
from mtf_core.ops.creation import constant
from mtf_core.ops.einsum import einsum
from mtf_core.ops.indexing import gather, one_hot
from mtf_core.ops.reshape import rename_dimension, replace_dimensions, reshape
from mtf_core.ops.selection import sample_with_temperature
from mtf_core.ops.slicing import concat
from mtf_core.ops.top_k import top_k
from mtf_core.shapes import Dimension, Shape

#: The end-of-sequence id Mesh TensorFlow assumes.
EOS_ID = 1
#: A score no real sequence reaches (keeps float arithmetic finite).
INF = 1e7


def _with_dim(t: Tensor, old: Dimension, new: Dimension) -> Shape:
    return Shape([new if d == old else d for d in t.shape])


def _select(
    candidates: Sequence[Tensor],
    scores: Tensor,
    source_dim: Dimension,
    beam_dim: Dimension,
) -> tuple[list[Tensor], Tensor]:
    """The ``beam_dim.size`` best candidates by ``scores`` along
    ``source_dim``: each of ``candidates`` gathered to ``beam_dim``, and the
    one-hot ``[batch, beam, source]`` selector of where each came from."""
    _, picked = top_k(scores, source_dim, beam_dim)
    chosen = [
        gather(c, picked, source_dim, output_shape=_with_dim(c, source_dim, beam_dim))
        for c in candidates
    ]
    return chosen, one_hot(picked, source_dim, dtype="float32")


def beam_search(
    logits_fn: Callable[..., Any],
    initial_ids: Tensor,
    alpha: float,
    states: Sequence[Tensor] | None = None,
    eos_id: int = EOS_ID,
    stop_early: bool = True,
    decode_length: Tensor | None = None,
    use_tpu: bool = True,
    dtype: Any = "float32",
    layout: Any = None,
    mesh_shape: Any = None,
    num_prefilter: int | None = 2,
) -> tuple[Tensor, Tensor]:
    """Beam search (see the module docstring).

    Args:
      logits_fn: ``logits_fn(step, ids, states) -> (logits, new_states)``:
        ``step`` a scalar int32, ``ids [batch, beam, length]``, ``logits
        [batch, beam, vocab]`` in ``dtype``; states are ``[batch * beam
        (named like batch), ...]`` tensors the model carries (e.g. caches),
        reordered with the beams each step.
      initial_ids: ``[batch, beam, length]`` int32 (zeros, or a prefix).
      alpha: the length penalty's exponent.
      decode_length: optional scalar int32, at most ``length``.
      use_tpu, layout, mesh_shape, num_prefilter: accepted for Mesh
        TensorFlow's signature; the search here always ranks all
        ``beam * vocab`` extensions (its TPU prefilter is lossy).

    Returns:
      ``(ids [batch, beam, length], scores [batch, beam])``, best first:
      the finished sequences of an example, or its alive ones if none
      finished.
    """
    del use_tpu, layout, mesh_shape, num_prefilter
    if initial_ids.shape.ndims != 3:
        raise ShapeError(
            f"beam_search: initial_ids [{initial_ids.shape}] must be [batch, beam, "
            "length]"
        )
    batch_dim, beam_dim, length_dim = initial_ids.shape.dims
    mesh = initial_ids.mesh
    dtype = dtypes.as_dtype_name(dtype)
    merged = Dimension(batch_dim.name, batch_dim.size * beam_dim.size)
    double_beam = Dimension("double_beam", 2 * beam_dim.size)
    triple_beam = Dimension("triple_beam", 3 * beam_dim.size)
    pairs = Shape([batch_dim, beam_dim])
    # Only beam 0 starts alive; the other beams have -INF log probability.
    first = one_hot(
        constant(mesh, 0, (), "int32"),
        beam_dim,
        on_value=0.0,
        off_value=-INF,
        dtype=dtype,
    )
    alive_log_probs = red.broadcast(first, pairs)
    max_length = constant(mesh, length_dim.size, (), "int32")
    decode_length = (
        max_length if decode_length is None else ew.minimum(decode_length, max_length)
    )

    def grow(i: Tensor, seq: Tensor, log_probs: Tensor, st: list[Tensor]) -> Any:
        logits, new_states = logits_fn(i, seq, st)
        vocab_dim = logits.shape.dims[-1]
        penalty = ew.pow((ew.cast(i + 1, logits.dtype) + 5.0) / 6.0, alpha)
        scores = (red.log_softmax(logits, vocab_dim) + log_probs) / penalty
        flat = Dimension("beam_and_vocab", beam_dim.size * vocab_dim.size)
        top_scores, top_flat = top_k(
            reshape(scores, Shape([batch_dim, flat])), flat, double_beam
        )
        from_beam = top_flat // vocab_dim.size
        token = top_flat % vocab_dim.size
        top_seq = gather(
            seq, from_beam, beam_dim, output_shape=_with_dim(seq, beam_dim, double_beam)
        )
        top_seq = top_seq + token * one_hot(i, length_dim, dtype="int32")
        return (
            top_seq,
            top_scores * penalty,  # log probs
            top_scores,
            ew.equal(token, eos_id),
            new_states,
            one_hot(from_beam, beam_dim, dtype="float32"),
        )

    def body(
        i: Tensor,
        alive_seq: Tensor,
        alive_lp: Tensor,
        fin_seq: Tensor,
        fin_scores: Tensor,
        fin_flags: Tensor,
        *st: Tensor,
    ) -> list[Tensor]:
        st_pairs = [replace_dimensions(s, merged, [batch_dim, beam_dim]) for s in st]
        seq2, lp2, scores2, done2, new_states, from_beam = grow(
            i, alive_seq, alive_lp, st_pairs
        )
        # alive: the best non-finished extensions
        alive_rank = scores2 + ew.cast(done2, scores2.dtype) * -INF
        (alive_seq, alive_lp), to_alive = _select(
            [seq2, lp2], alive_rank, double_beam, beam_dim
        )
        # finished: the best of the old finished and the newly finished
        fin_rank = scores2 + (1.0 - ew.cast(done2, scores2.dtype)) * -INF

        def join(old: Tensor, new: Tensor) -> Tensor:
            return concat(
                [
                    rename_dimension(old, beam_dim.name, triple_beam.name),
                    rename_dimension(new, double_beam.name, triple_beam.name),
                ],
                triple_beam.name,
            )

        all_scores = join(fin_scores, fin_rank)
        (fin_seq, fin_scores, fin_flags), _ = _select(
            [join(fin_seq, seq2), all_scores, join(fin_flags, done2)],
            all_scores,
            triple_beam,
            beam_dim,
        )
        # States follow their beams: old beam -> extension -> alive beam.
        old_beam = Dimension("old_beam", beam_dim.size)
        route = einsum(
            [rename_dimension(from_beam, beam_dim.name, old_beam.name), to_alive],
            output_shape=Shape([batch_dim, old_beam, beam_dim]),
        )
        moved = []
        for s in new_states:
            s = einsum(
                [
                    rename_dimension(s, beam_dim.name, old_beam.name),
                    ew.cast(route, s.dtype),
                ],
                output_shape=s.shape,
            )
            moved.append(replace_dimensions(s, [batch_dim, beam_dim], merged))
        return [i + 1, alive_seq, alive_lp, fin_seq, fin_scores, fin_flags, *moved]

    def cond(
        i: Tensor,
        alive_seq: Tensor,
        alive_lp: Tensor,
        fin_seq: Tensor,
        fin_scores: Tensor,
        fin_flags: Tensor,
        *st: Tensor,
    ) -> Tensor:
        more = ew.less(i, decode_length)
        if not stop_early:
            return more
        # The best alive sequence, at the longest length's penalty, is the
        # best any alive sequence can still score.
        best_penalty = ew.pow((ew.cast(decode_length, dtype) + 5.0) / 6.0, alpha)
        best_alive = gather(alive_lp, 0, beam_dim) / best_penalty
        flags = ew.cast(fin_flags, fin_scores.dtype)
        worst_finished = red.reduce_min(fin_scores * flags, reduced_dim=beam_dim)
        none = 1.0 - ew.cast(red.reduce_any(fin_flags, reduced_dim=beam_dim), dtype)
        worst_finished = worst_finished + none * -INF
        settled = red.reduce_all(ew.greater(worst_finished, best_alive))
        return ew.logical_and(more, ew.logical_not(settled))

    loop_states = [
        replace_dimensions(s, [batch_dim, beam_dim], merged) for s in (states or [])
    ]
    outs = while_loop(
        cond,
        body,
        [
            constant(mesh, 0, (), "int32"),
            initial_ids,
            alive_log_probs,
            initial_ids,
            constant(mesh, -INF, pairs, dtype),
            constant(mesh, False, pairs, "bool"),
            *loop_states,
        ],
    )
    _, alive_seq, alive_lp, fin_seq, fin_scores, fin_flags = outs[:6]
    any_finished = red.reduce_any(fin_flags, reduced_dim=beam_dim)
    return (
        ew.where(any_finished, fin_seq, alive_seq),
        ew.where(any_finished, fin_scores, alive_lp),
    )


def greedy_decode(
    logits_fn: Callable[..., Any],
    initial_ids: Tensor,
    temperature: float = 0.0,
    initial_states: Sequence[Tensor] | None = None,
    eos_id: int = EOS_ID,
    forced_ids: Tensor | None = None,
    use_tpu: bool = True,
) -> Tensor:
    """Decodes position after position: ``argmax`` of ``logits_fn``'s logits
    (``temperature=0``) or a sample at ``temperature``, until every sequence
    has an EOS or the length is full.

    ``logits_fn(step, ids, states) -> (logits [..., vocab], new_states)``;
    ``initial_ids [..., length]`` int32 zeros.  Where ``forced_ids`` is
    nonzero, its id is used instead of the decoded one.  Returns the ids.
    """
    del use_tpu
    length_dim = initial_ids.shape.dims[-1]
    mesh = initial_ids.mesh
    if not isinstance(temperature, (int, float)):
        raise ArgumentError(
            f"greedy_decode: temperature {temperature!r} is not a number"
        )
    steps = constant(mesh, length_dim.size, (), "int32")

    def cond(step: Tensor, ids: Tensor, *states: Tensor) -> Tensor:
        has_eos = red.reduce_any(ew.equal(ids, eos_id), reduced_dim=length_dim)
        done = ew.logical_or(ew.equal(step, steps), red.reduce_all(has_eos))
        return ew.logical_not(done)

    def body(step: Tensor, ids: Tensor, *states: Tensor) -> list[Tensor]:
        logits, new_states = logits_fn(step, ids, list(states))
        new_ids = sample_with_temperature(logits, logits.shape.dims[-1], temperature)
        if forced_ids is not None:
            forced = gather(forced_ids, step, length_dim)
            new_ids = forced + new_ids * ew.cast(ew.equal(forced, 0), "int32")
        ids = ids + new_ids * one_hot(step, length_dim, dtype="int32")
        return [step + 1, ids, *new_states]

    outs = while_loop(
        cond,
        body,
        [constant(mesh, 0, (), "int32"), initial_ids, *(initial_states or [])],
    )
    return outs[1]
