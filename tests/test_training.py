"""Training runs: data, presets, checkpoints that resume under another layout,
the ``mtf-train`` command, and sampling."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from mtf_core.errors import ConfigError, LayoutError, SerializationError
from mtf_core.models import TransformerConfig, build_lm
from mtf_core.presets import preset_names, resolve_layout
from mtf_core.train import cli
from mtf_core.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from mtf_core.train.data import (
    PAD_ID,
    UNK_ID,
    CharVocab,
    TextDataset,
    python_source_text,
    unigram_entropy,
)

SMALL = TransformerConfig(
    num_layers=1, d_model=32, heads=8, d_kv=4, d_ff=64, vocab=64, length=16, batch=8
)


# -- data -------------------------------------------------------------------


def test_python_sources_are_real_text_of_the_requested_size():
    text = python_source_text(50_000)
    assert len(text) == 50_000
    assert "def " in text and "import " in text


def test_char_vocab_keeps_the_most_frequent_characters_and_round_trips():
    vocab = CharVocab.build("aaabbc", size=4)  # pad, unk, 'a', 'b'
    assert vocab.size == 4 and vocab.chars == ("a", "b")
    assert vocab.encode("abcz") == [2, 3, UNK_ID, UNK_ID]
    assert vocab.decode([2, PAD_ID, 3]) == "ab"
    assert CharVocab.from_json(vocab.to_json()) == vocab
    with pytest.raises(ConfigError, match="got 2"):
        CharVocab.build("abc", size=2)


def test_dataset_batches_are_shifted_windows_and_a_function_of_the_step():
    ids = np.arange(1000, dtype=np.int32)
    data = TextDataset(ids, batch=4, length=8, seed=3)
    b = data.batch(5)
    assert b["inputs"].shape == (4, 8) and b["targets"].shape == (4, 8)
    np.testing.assert_array_equal(b["targets"][:, :-1], b["inputs"][:, 1:])
    np.testing.assert_array_equal(data.batch(5)["inputs"], b["inputs"])
    assert not np.array_equal(data.batch(6)["inputs"], b["inputs"])
    assert data.eval_batch()["inputs"].min() >= len(data.train_ids)  # held out
    with pytest.raises(ConfigError, match="length \\+ 1"):
        TextDataset(ids[:20], batch=2, length=30)


def test_unigram_entropy_of_a_known_distribution():
    assert unigram_entropy(np.array([1, 2, 3, 4])) == pytest.approx(np.log(4))
    assert unigram_entropy(np.array([5, 5, 5])) == pytest.approx(0.0)


# -- presets ------------------------------------------------------------------


def test_presets_by_name_alias_or_rules_with_their_mesh_shapes():
    assert preset_names() == ["2d", "data-parallel", "model-parallel"]
    dp = resolve_layout("data-parallel", 8)
    assert (str(dp.mesh_shape), str(dp.rules)) == ("all:8", "batch:all")
    mp = resolve_layout("mp", 4)
    assert (str(mp.mesh_shape), str(mp.rules)) == (
        "all:4",
        "d_ff:all;heads:all;vocab:all",
    )
    two = resolve_layout("2d", 8)
    assert str(two.mesh_shape) == "rows:2,cols:4"
    assert str(two.rules) == "batch:rows;d_ff:cols;heads:cols;vocab:cols"
    custom = resolve_layout("batch:x;d_ff:y", 8, mesh_shape="x:2;y:4")
    assert custom.preset is None and str(custom.rules) == "batch:x;d_ff:y"
    assert resolve_layout("", 1).rules.pairs == ()


def test_layout_resolution_errors_name_the_bad_value():
    with pytest.raises(ConfigError, match="'3d'"):
        resolve_layout("3d", 8)
    with pytest.raises(ConfigError, match="4 processors but 8 devices"):
        resolve_layout("dp", 8, mesh_shape="all:4")
    with pytest.raises(LayoutError, match="'rows'.*preset '2d'"):
        resolve_layout("2d", 8, mesh_shape="x:2;y:4")


# -- checkpoints ----------------------------------------------------------------


def test_checkpoints_round_trip_keep_the_newest_and_point_to_the_latest(tmp_path):
    values = {"layer/w": np.arange(6.0).reshape(2, 3), "global_step": np.int32(7)}
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, values, {"note": step}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == [
        "ckpt-000003.npz",
        "ckpt-000004.npz",
    ]
    assert latest_checkpoint(tmp_path).name == "ckpt-000004.npz"
    ck = load_checkpoint(tmp_path)
    assert ck.step == 4 and ck.metadata["note"] == 4
    np.testing.assert_array_equal(ck.values["layer/w"], values["layer/w"])
    assert ck.metadata["variables"]["layer/w"] == {"shape": [2, 3], "dtype": "float64"}


def test_loading_a_missing_or_foreign_checkpoint_fails_clearly(tmp_path):
    with pytest.raises(SerializationError, match="no checkpoint"):
        load_checkpoint(tmp_path)
    path = save_checkpoint(tmp_path, 1, {"w": np.zeros(2)})
    meta = json.loads(path.with_suffix(".json").read_text())
    meta["format"] = "something-else"
    path.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(SerializationError, match="something-else"):
        load_checkpoint(path)


# -- training with TensorFlow ------------------------------------------------------


def _batch(cfg, seed):
    tok = np.random.RandomState(seed).randint(1, cfg.vocab, (cfg.batch, cfg.length + 1))
    return {
        "inputs": tok[:, :-1].astype(np.int32),
        "targets": tok[:, 1:].astype(np.int32),
    }


@pytest.mark.tf
def test_checkpoint_from_one_layout_resumes_under_another_with_the_same_next_loss(
    devices, tmp_path
):
    from mtf_core.lowering.training import Trainer

    first = Trainer(build_lm(SMALL, "adam", 1e-2), resolve_layout("dp", 4), devices)
    for seed in (0, 1):
        first.step(_batch(SMALL, seed))
    path = first.save(str(tmp_path), {"model": SMALL.to_dict()})
    expected = first.step(_batch(SMALL, 2))
    ck = load_checkpoint(path)
    assert ck.step == 2 and ck.metadata["layout"] == "batch:all"
    second = Trainer(build_lm(SMALL, "adam", 1e-2), resolve_layout("2d", 4), devices)
    second.restore(ck)
    assert second.global_step == 2
    assert second.step(_batch(SMALL, 2)) == pytest.approx(expected, rel=1e-5)


@pytest.mark.tf
def test_a_resumed_run_with_dropout_draws_the_masks_the_uninterrupted_run_drew(
    devices, tmp_path
):
    from mtf_core.lowering.training import Trainer

    cfg = dataclasses.replace(SMALL, dropout_rate=0.5)
    first = Trainer(build_lm(cfg, "adam", 1e-2), resolve_layout("dp", 4), devices)
    for seed in (0, 1):
        first.step(_batch(cfg, seed))
    path = first.save(str(tmp_path), {"model": cfg.to_dict()})
    expected = first.step(_batch(cfg, 2))
    second = Trainer(build_lm(cfg, "adam", 1e-2), resolve_layout("2d", 4), devices)
    second.restore(load_checkpoint(path))
    assert second.fn.random_step == 2  # the step number seeds the masks
    assert second.step(_batch(cfg, 2)) == pytest.approx(expected, rel=1e-5)


@pytest.mark.tf
def test_mtf_train_command_trains_resumes_on_another_mesh_and_samples(
    devices, tmp_path, capsys
):
    ckpt, tb = tmp_path / "ckpt", tmp_path / "tb"
    common = [
        "--layers", "1", "--d_model", "16", "--heads", "8", "--d_kv", "2",
        "--d_ff", "32", "--length", "8", "--batch", "8", "--vocab", "32",
        "--corpus_bytes", "20000", "--checkpoint_dir", str(ckpt), "--no_progress",
        "--no_eval",
    ]  # fmt: skip
    assert (
        cli.main([*common, "--steps", "3", "--layout", "2d", "--tensorboard", str(tb)])
        == 0
    )
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["global_step"] == 3 and first["mesh_shape"] == "rows:2,cols:4"
    assert list(tb.glob("events.out.tfevents.*"))
    argv = [*common, "--steps", "2", "--layout", "batch:x;vocab:x", "--mesh", "x:2"]
    assert cli.main([*argv, "--resume"]) == 2  # one mesh axis cannot split two dims
    assert "'x'" in capsys.readouterr().err
    # A rule for a dim the model lacks (misspelt) splits nothing: said, as
    # a warning (Mesh TF layouts may name dims a model lacks).
    argv = [*common, "--steps", "2", "--mesh", "x:2"]
    argv += ["--layout", "heads:x;vocab:x;btach:x"]
    assert cli.main([*argv, "--resume"]) == 0
    out, err = capsys.readouterr()
    assert "warning: layout rule 'btach:x' names no dim of this model" in err
    assert "heads:x" not in err and "vocab:x" not in err
    second = json.loads(out.strip().splitlines()[-1])
    assert second["global_step"] == 5 and second["steps"] == 2
    assert load_checkpoint(ckpt).metadata["mesh_shape"] == "x:2"
    sample = [
        "sample",
        "--checkpoint_dir",
        str(ckpt),
        "--prompt",
        "def",
        "--max_new_tokens",
        "5",
    ]
    assert cli.main(sample) == 0
    text = capsys.readouterr().out.strip().splitlines()[-1]
    assert text.startswith("def") and len(text) >= 3


def test_mtf_train_reports_bad_options_as_errors(capsys):
    assert (
        cli.main(["--layout", "no-such-preset", "--steps", "1", "--no_progress"]) == 2
    )
    assert "'no-such-preset'" in capsys.readouterr().err
    assert cli.main(["--mesh", "x:2", "--devices", "4"]) == 2
    assert "--devices is 4" in capsys.readouterr().err


def test_auto_layout_gives_a_clear_error_when_the_planner_is_unavailable(monkeypatch):
    import mtf_core

    monkeypatch.setitem(mtf_core._LAZY, "auto_layout", ("no_such_module", "x"))
    monkeypatch.delitem(mtf_core.__dict__, "auto_layout", raising=False)
    args = cli.parse_args(["--layout", "auto", "--mesh", "x:2"])
    with pytest.raises(ConfigError, match="layout planner"):
        cli.choose_layout(args, build_lm(SMALL), 2)


@pytest.mark.tf
def test_greedy_sampling_continues_a_pattern_the_model_learned(devices):
    from mtf_core.lowering.training import LMSampler, Trainer

    cfg = SMALL.replace(vocab=8, length=8, batch=8)
    model = build_lm(cfg, "adam", 3e-2)
    trainer = Trainer(model, resolve_layout("", 1), devices)
    pattern = np.array([2, 3, 4, 5, 6] * 4, np.int32)
    rng = np.random.RandomState(0)
    for _ in range(60):
        starts = rng.randint(0, 5, size=cfg.batch)
        win = np.stack([pattern[s : s + cfg.length + 1] for s in starts])
        trainer.step({"inputs": win[:, :-1], "targets": win[:, 1:]})
    sampler = LMSampler(
        build_lm(cfg.replace(batch=1)), trainer.state(), resolve_layout("", 1)
    )
    (greedy,) = sampler.generate([[4, 5]], max_new_tokens=10)
    assert greedy == [4, 5, 6, 2, 3, 4, 5, 6, 2, 3, 4, 5]
    hot = sampler.generate([[4, 5]], max_new_tokens=10, temperature=1.0, seed=1)
    assert len(hot[0]) == 12 and set(hot[0]) <= set(range(cfg.vocab))
    with pytest.raises(ConfigError, match="-1"):
        sampler.generate([[4]], 1, temperature=-1)


@pytest.mark.tf
@pytest.mark.slow
def test_lm_loss_falls_well_below_the_unigram_entropy_of_python_sources(devices):
    from mtf_core.lowering.training import Trainer

    text = python_source_text(300_000)
    vocab = CharVocab.build(text, 64)
    cfg = TransformerConfig(
        num_layers=2,
        d_model=64,
        heads=8,
        d_kv=8,
        d_ff=256,
        vocab=64,
        length=32,
        batch=16,
    )
    data = TextDataset(vocab.encode_array(text), cfg.batch, cfg.length)
    entropy = unigram_entropy(data.train_ids)
    trainer = Trainer(build_lm(cfg, "adam", 3e-3), resolve_layout("dp", 4), devices)
    losses = [trainer.step(data.batch(i)) for i in range(300)]
    assert losses[0] > entropy  # starts near log(vocab)
    assert np.mean(losses[-20:]) < entropy - 0.8


@pytest.mark.solver
def test_auto_layout_asks_the_planner_for_rules_on_the_given_mesh():
    args = cli.parse_args(["--layout", "auto", "--mesh", "x:2;y:2"])
    model = build_lm(SMALL, "sgd")
    choice = cli.choose_layout(args, model, 4)
    assert choice.preset == "auto" and str(choice.mesh_shape) == "x:2,y:2"
    names = {
        d.name for op in model.graph.operations for t in op.outputs for d in t.shape
    }
    assert {t for t, _ in choice.rules} <= names
    assert {m for _, m in choice.rules} <= {"x", "y"}
