"""Training runs: text data, checkpoints and the ``mtf-train`` command.

Nothing here imports TensorFlow: the training loop and sampling, which lower
graphs, live in :mod:`mtf_core.lowering.training` and are imported when a run
starts.
"""

from mtf_core.train.checkpoint import Checkpoint, latest_checkpoint, save_checkpoint
from mtf_core.train.data import CharVocab, TextDataset, python_source_text

__all__ = [
    "CharVocab",
    "Checkpoint",
    "TextDataset",
    "latest_checkpoint",
    "python_source_text",
    "save_checkpoint",
]
