"""Download Mesh TF's wheel, unpack its tests, run them, print the table.

    python -m conformance                      # mtf_core, all 22 files
    python -m conformance --files ops_test     # one file
    python -m conformance --target mesh_tf --python .venv-mtf/bin/python

Each test file runs in its own subprocess (a crash costs one file), as its own
``__main__``, so it sets TF's mode as it would on Mesh TF (most call
``tf.disable_v2_behavior()``).  The last line is ``N passed, M failed``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conformance.report import Case, FileResult, format_table, parse_xml

VERSION = "0.1.21"
WHEEL = f"mesh_tensorflow-{VERSION}-py3-none-any.whl"
# The test cases each file has when it runs to the end (on Mesh TF 0.1.21
# itself, TF 2.21; data_aug_lib_test never imports there either, it needs
# tf.contrib: its three test methods): a file that dies before reporting
# counts them all as failed.  188 in all.
EXPECTED: dict[str, int] = {
    "auto_mtf/api_test.py": 3,
    "auto_mtf/graph_interface_test.py": 3,
    "auto_mtf/layout_optimizer_test.py": 7,
    "auto_mtf/memory_estimator_test.py": 2,
    "auto_mtf/scheduler_test.py": 5,
    "auto_mtf/valid_layouts_test.py": 3,
    "experimental/data_aug_lib_test.py": 3,
    "experimental/input_reader_test.py": 2,
    "import_test.py": 1,
    "layers_test.py": 35,
    "ops_test.py": 60,
    "simd_mesh_impl_test.py": 12,
    "test_utils_test.py": 7,
    "transformer/adaptive_softmax_test.py": 7,
    "transformer/dataset_test.py": 3,
    "transformer/funnel_transformer_test.py": 6,
    "transformer/learning_rate_schedules_test.py": 1,
    "transformer/memory_layers_test.py": 2,
    "transformer/transformer_layers_test.py": 8,
    "transformer/utils_test.py": 8,
    "transformer/vocab_embeddings_test.py": 9,
    "utils_test.py": 1,
}
# What is taken out of the wheel: the tests and Mesh TF's own model packages.
_PACKAGES = (
    "mesh_tensorflow/transformer/",
    "mesh_tensorflow/experimental/",
    "mesh_tensorflow/bert/",
)
_ROOT = Path(__file__).resolve().parent.parent


def fetch_wheel(cache: Path) -> Path:
    """The wheel from PyPI, downloaded once into ``cache/wheels``."""
    wheel = cache / "wheels" / WHEEL
    if not wheel.exists():
        wheel.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q",
             f"mesh-tensorflow=={VERSION}", "-d", str(wheel.parent)],
            check=True,
        )  # fmt: skip
    return wheel


def unpack(wheel: Path, cache: Path) -> tuple[Path, list[str]]:
    """Tests and model packages into ``cache/src``; the test files, sorted."""
    src = cache / "src"
    tests = []
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if not name.startswith("mesh_tensorflow/") or not name.endswith(
                (".py", ".gin")
            ):
                continue
            is_test = name.endswith("_test.py")
            if is_test or name.startswith(_PACKAGES):
                zf.extract(name, src)
            if is_test:
                tests.append(name.removeprefix("mesh_tensorflow/"))
    return src / "mesh_tensorflow", sorted(tests)


def run_file(
    test: str, mesh_tf_dir: Path, out: Path, python: str, target: str, timeout: float
) -> FileResult:
    """One test file in a subprocess; its cases from absltest's XML report."""
    stem = test.replace("/", "__").removesuffix(".py")
    xml, log = out / f"{stem}.xml", out / f"{stem}.log"
    xml.unlink(missing_ok=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p
    )
    cmd = [python, "-m", "conformance.bootstrap", "--target", target,
           "--mesh-tf-dir", str(mesh_tf_dir), str(mesh_tf_dir / test),
           f"--xml_output_file={xml}"]  # fmt: skip
    try:
        proc = subprocess.run(
            cmd, cwd=_ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        text, died = proc.stdout + proc.stderr, f"exit status {proc.returncode}"
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() + (e.stderr or b"").decode()
        died = f"timed out after {timeout:.0f} s"
    log.write_text(text)
    if xml.exists() and xml.stat().st_size:
        result = parse_xml(test, xml)
        missing = EXPECTED.get(test, 0) - result.total
        if missing > 0:  # cases that never ran (e.g. a class that failed to set up)
            why = f"[framework] did not run ({missing} of {EXPECTED[test]} cases)"
            result.cases += [Case("(not run)", False, why)] * missing
        return result
    last = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or [died]
    from conformance.report import reason

    why = reason(text, last[0]) + f" [file did not report: {died}]"
    count = EXPECTED.get(test, 1)
    return FileResult(test, [Case(f"(all {count})", False, why)] * count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache-dir", default=str(_ROOT / ".cache" / "conformance"))
    parser.add_argument("--target", choices=("mtf_core", "mesh_tf"), default="mtf_core")
    parser.add_argument("--python", default=sys.executable, help="interpreter to run")
    parser.add_argument("--files", nargs="*", help="substrings of test files to run")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0, help="s per file")
    parser.add_argument(
        "--min-passed", type=int, default=0, help="exit 1 if fewer tests pass"
    )
    args = parser.parse_args(argv)
    cache = Path(args.cache_dir)
    mesh_tf_dir, tests = unpack(fetch_wheel(cache), cache)
    if args.files:
        tests = [t for t in tests if any(f in t for f in args.files)]
    out = cache / "results" / args.target
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(
            pool.map(
                lambda t: run_file(
                    t, mesh_tf_dir, out, args.python, args.target, args.timeout
                ),
                tests,
            )
        )
    print(format_table(results))
    passed = sum(r.passed for r in results)
    if passed < args.min_passed:
        print(
            f"conformance: {passed} passed, fewer than --min-passed {args.min_passed}"
        )
        return 1
    return 0
