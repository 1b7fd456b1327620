"""Results of one test file (absltest's JUnit XML) and the printed table."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

# Names the "compat ops" work adds (ops, layers, variables, decoding); a
# failure that names one is that area's, anything else in mtf_core is the
# framework's (shapes, graph, lowering, training loop, optimizers, utils).
OPS_NAMES = frozenset(
    """
    VariableDType to_float to_int32 to_bfloat16 mtf_range anonymize
    tensor_dim_to_mesh_dim_size import_fully_replicated reduce_first
    nth_largest_element nth_smallest_element beam_search sample_with_temperature
    while_loop top_1 top_k halo_exchange pool_tensor_1d stride_tensor_1d conv1d
    conv2d conv3d separable_conv1d dense dense_product us_einsum
    unit_scaling_convention rename_length_to_memory_length
    VarianceScalingInitializer batch_norm layer_norm dot_product_attention
    masked_local_attention_1d attention_bias_local_block embedding_weights
    embedding dropout gather sigmoid_cross_entropy_with_logits
    softmax_cross_entropy_with_logits max_pool2d avg_pool2d
    multihead_attention local_attention_1d attention random_uniform
    truncated_normal dense_relu_dense weights_nonzero corr max_pool3d
    avg_pool3d multihead_attention_vars
    """.split()
)
_OPS_PATHS = ("mtf_core/ops/", "mtf_core/layers", "mtf_core/beam_search")

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*)$")
_NAME = re.compile(r"'(\w+)'")


@dataclass(frozen=True)
class Case:
    """One test case and, if it did not pass, why."""

    name: str
    passed: bool
    reason: str = ""


@dataclass
class FileResult:
    """A test file's cases (or, if it never reported, how many it has)."""

    file: str
    cases: list[Case] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(c.passed for c in self.cases)

    @property
    def total(self) -> int:
        return len(self.cases)


def _where(traceback: str) -> str:
    """The deepest frame in mtf_core, else the deepest in Mesh TF's code."""
    frames = _FRAME.findall(traceback)
    for path, line in reversed(frames):
        if "/mtf_core/" in path:
            return "mtf_core/" + path.split("/mtf_core/", 1)[1] + f":{line}"
    for path, line in reversed(frames):
        if "/mesh_tensorflow/" in path:
            return path.split("/mesh_tensorflow/", 1)[1] + f":{line}"
    return ""


def _error(traceback: str, message: str) -> str:
    lines = [ln for ln in traceback.strip().splitlines() if ln.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.match(line.strip()):
            return line.strip()
    return (message or (lines[-1] if lines else "failed")).strip()


def area(error: str, where: str) -> str:
    """Which work a failure belongs to: ``ops``, ``framework`` or ``env``."""
    if any(p in where for p in _OPS_PATHS):
        return "ops"
    if "'mtf_core.layers'" in error:
        return "ops"
    if "AttributeError" in error or "unexpected keyword" in error:
        names = set(_NAME.findall(error)) | set(re.findall(r"(\w+)\(\)", error))
        if names & OPS_NAMES:
            return "ops"
    if "ModuleNotFoundError" in error and "mtf_core" not in error:
        return "env"
    return "framework"


def reason(traceback: str, message: str = "", limit: int = 160) -> str:
    """One line: ``[area] Error: message (where)``."""
    error = _error(traceback, message).splitlines()[0]
    where = _where(traceback)
    text = f"[{area(error, where)}] {error}"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text + (f" ({where})" if where else "")


def parse_xml(file: str, xml_path: Path) -> FileResult:
    """Cases from absltest's ``--xml_output_file`` report."""
    result = FileResult(file)
    root = ET.parse(xml_path).getroot()
    for case in root.iter("testcase"):
        if case.get("name") == "test_session":
            continue  # TF's deprecated TestCase.test_session, not a Mesh TF test
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            text = problem.text or ""
            result.cases.append(
                Case(name, False, reason(text, problem.get("message", "")))
            )
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            result.cases.append(Case(name, False, "[env] skipped"))
        else:
            result.cases.append(Case(name, True))
    return result


def format_table(results: list[FileResult]) -> str:
    """Per file: tests and passed, then each failure's reason; the summary."""
    width = max([len(r.file) for r in results] + [4])
    out = [f"{'file':<{width}}  tests  passed"]
    for r in results:
        out.append(f"{r.file:<{width}}  {r.total:5d}  {r.passed:6d}")
        seen = set()
        for c in r.cases:
            if not c.passed and (c.name, c.reason) not in seen:  # "(all N)" once
                seen.add((c.name, c.reason))
                out.append(f"    {c.name}: {c.reason}")
    passed = sum(r.passed for r in results)
    failed = sum(r.total - r.passed for r in results)
    out.append(f"{passed} passed, {failed} failed")
    return "\n".join(out)
