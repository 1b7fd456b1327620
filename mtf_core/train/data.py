"""Real text that ships with Python, a character vocabulary and LM batches.

The corpus is the standard library's own ``.py`` sources (under
``sysconfig.get_paths()["stdlib"]``): megabytes of real text on every machine
that runs this package, no download needed.

>>> vocab = CharVocab.build("abracadabra", size=5)
>>> vocab.decode(vocab.encode("bar"))
'bar'
>>> vocab.encode("z")  # unknown characters map to <unk>
[1]
"""

from __future__ import annotations

import collections
import math
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mtf_core.errors import ConfigError

PAD_ID = 0
UNK_ID = 1


def python_source_text(
    max_bytes: int = 2_000_000, root: str | Path | None = None
) -> str:
    """Concatenated ``.py`` files of the standard library (sorted by path,
    tests and site-packages skipped) up to ``max_bytes`` characters."""
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise ConfigError(f"corpus directory {str(base)!r} does not exist")
    parts: list[str] = []
    total = 0
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).parts
        if any(p in ("site-packages", "test", "tests", "idlelib") for p in rel):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    if not parts:
        raise ConfigError(f"no readable .py files under {str(base)!r}")
    return "".join(parts)[:max_bytes]


@dataclass(frozen=True)
class CharVocab:
    """Characters to ids: 0 is padding, 1 is unknown, then the most frequent
    characters of the corpus (ties broken by character)."""

    chars: tuple[str, ...]

    @classmethod
    def build(cls, text: str, size: int) -> CharVocab:
        if size < 3:
            raise ConfigError(
                f"vocab size must be >= 3 (pad, unk, one char), got {size}"
            )
        counts = collections.Counter(text)
        ranked = sorted(counts, key=lambda ch: (-counts[ch], ch))
        return cls(tuple(ranked[: size - 2]))

    @property
    def size(self) -> int:
        return len(self.chars) + 2

    def encode(self, text: str) -> list[int]:
        table = self._table()
        return [table.get(ch, UNK_ID) for ch in text]

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int32)

    def decode(self, ids: Sequence[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i == PAD_ID:
                continue
            out.append(self.chars[i - 2] if 2 <= i < self.size else "\ufffd")
        return "".join(out)

    def _table(self) -> dict[str, int]:
        return {ch: i + 2 for i, ch in enumerate(self.chars)}

    def to_json(self) -> list[str]:
        return list(self.chars)

    @classmethod
    def from_json(cls, chars: Sequence[str]) -> CharVocab:
        return cls(tuple(chars))


class TextDataset:
    """Token ids of a text, cut into ``[batch, length]`` LM examples.

    ``batch(step)`` is a pure function of ``(seed, step)``, so a resumed run
    sees exactly the batches it would have seen without stopping.  The last
    ``eval_fraction`` of the tokens is held out for :meth:`eval_batch`.
    """

    def __init__(
        self,
        ids: np.ndarray,
        batch: int,
        length: int,
        seed: int = 0,
        eval_fraction: float = 0.05,
    ) -> None:
        ids = np.asarray(ids, dtype=np.int32)
        n_eval = int(len(ids) * eval_fraction)
        self.train_ids = ids[: len(ids) - n_eval] if n_eval else ids
        self.eval_ids = ids[len(ids) - n_eval :] if n_eval else ids
        self.batch_size = batch
        self.length = length
        self.seed = seed
        for what, part in (("training", self.train_ids), ("held-out", self.eval_ids)):
            if len(part) < length + 2:
                raise ConfigError(
                    f"{what} text has {len(part)} tokens; need more than length + 1 "
                    f"= {length + 1}"
                )

    def _cut(self, ids: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        starts = rng.integers(0, len(ids) - self.length - 1, size=self.batch_size)
        window = np.stack([ids[s : s + self.length + 1] for s in starts])
        return {"inputs": window[:, :-1], "targets": window[:, 1:]}

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """Training batch number ``step``: ``inputs`` and ``targets`` (shifted)."""
        return self._cut(self.train_ids, np.random.default_rng([self.seed, step]))

    def eval_batch(self, index: int = 0) -> dict[str, np.ndarray]:
        return self._cut(
            self.eval_ids, np.random.default_rng([self.seed, 1_000_003, index])
        )


def unigram_entropy(ids: np.ndarray) -> float:
    """Entropy (nats per token) of the token frequencies: the loss of the best
    model that ignores context."""
    counts = np.bincount(np.asarray(ids).ravel())
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def tokens_per_second(batch: int, length: int, seconds: float) -> float:
    return batch * length / seconds if seconds > 0 else math.inf
