"""The one-way dependency rule, as far as imports can show it: the contracts
`lint-imports` checks, and what a fresh interpreter loads."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

import mtf_core as mtf
from mtf_core import extensions

ROOT = Path(__file__).resolve().parent.parent

#: (importer, imported) pairs that must never occur, directly or indirectly.
FORBIDDEN = [
    *(
        (low, web)
        for low in ("mtf_core", "cost_models", "layout_planner")
        for web in ("httpx", "fastapi", "starlette", "uvicorn", "psycopg")
    ),
    *(
        ("mtf_core", up)
        for up in ("ortools", "networkx", "layout_planner", "cost_models", "api")
    ),
    ("cost_models", "ortools"),
    ("layout_planner", "api"),
    ("cost_models", "layout_planner"),
]


def _contracts() -> list[dict[str, list[str]]]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")
    out = []
    for section in cfg.sections():
        if not section.startswith("importlinter:contract:"):
            continue
        c = {k: cfg[section][k].split() for k in cfg[section]}
        out.append({**c, "type": c["type"]})
    return out


def _covered(importer: str, imported: str) -> bool:
    for c in _contracts():
        if c["type"] == ["forbidden"]:
            if importer in c["source_modules"] and imported in c["forbidden_modules"]:
                return True
        elif c["type"] == ["layers"]:
            layers = c["layers"]
            if importer in layers and imported in layers:
                if layers.index(importer) > layers.index(imported):
                    return True
    return False


@pytest.mark.parametrize("importer, imported", FORBIDDEN)
def test_every_forbidden_direction_has_an_import_linter_contract(importer, imported):
    assert _covered(importer, imported), f"no contract forbids {importer} -> {imported}"


def test_import_linter_keeps_every_contract():
    out = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_mtf_auto_layout_plans_locally_without_web_packages_or_the_service():
    code = """
import sys
import mtf_core as mtf
assert "layout_planner" not in sys.modules, "mtf_core imported the planner"
g = mtf.Graph(); m = mtf.Mesh(g, "m")
y = mtf.reduce_sum(mtf.zeros(m, "a:8,b:4") * 2.0, output_shape="a:8")
plan = mtf.auto_layout(g, "x:2", [y], objective="memory")
print(plan.status.value)
print(sorted(n for n in ("httpx", "fastapi", "starlette", "uvicorn", "psycopg",
                         "api.main", "api.service") if n in sys.modules))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    status, loaded = out.stdout.strip().splitlines()[-2:]
    assert status == "optimal" and loaded == "[]"


def test_mtf_names_from_upper_packages_come_through_the_extensions_seam():
    import api.client
    import layout_planner.auto_mtf
    import layout_planner.planner
    from layout_planner.options import PlanOptions

    assert {"auto_layout", "auto_mtf", "PlanOptions"} <= extensions.names()
    assert mtf.auto_layout is api.client.auto_layout
    assert mtf.auto_mtf is layout_planner.auto_mtf
    assert mtf.PlanOptions is PlanOptions
    # the planner itself takes no server: HTTP is the client's business
    import inspect

    assert (
        "server" not in inspect.signature(layout_planner.planner.auto_layout).parameters
    )
    with pytest.raises(AttributeError, match="has no attribute 'no_such_extension'"):
        mtf.no_such_extension  # noqa: B018
    with pytest.raises(AttributeError, match="no installed package provides it"):
        extensions.load("no_such_extension")
    with pytest.raises(extensions.ExtensionError, match="not a Python identifier"):
        extensions.register("not a name", 1)


def _import_cycles(package: str, type_checking: bool = True) -> list[set[str]]:
    """The strongly connected components (size > 1) of ``package``'s import
    graph, imports inside functions included (and those under
    ``if TYPE_CHECKING:`` unless ``type_checking`` is False)."""
    import grimp
    import networkx as nx

    g = grimp.build_graph(package, exclude_type_checking_imports=not type_checking)
    edges = [(m, d) for m in g.modules for d in g.find_modules_directly_imported_by(m)]
    comps = nx.strongly_connected_components(nx.DiGraph(edges))
    return [c for c in comps if len(c) > 1]


@pytest.mark.parametrize(
    "package, modules",
    [
        ("mtf_core", {"mtf_core.lowering.compiled", "mtf_core.lowering.spmd_compiled"}),
        (
            "mtf_core",
            {
                "mtf_core.ops.einsum",
                "mtf_core.ops.onehot_einsum",
                "mtf_core.ops.indexing",
                "mtf_core.ops.top_k",
            },
        ),
        # the front door and what it loads; dense and its initializers
        ("mtf_core", {"mtf_core", "mtf_core.layers", "mtf_core.models"}),
        ("mtf_core", {"mtf_core.layers.dense", "mtf_core.layers.initializers"}),
        (
            "mtf_core",
            {"mtf_core.autodiff", "mtf_core.ops.variables", "mtf_core.recompute"},
        ),
        (
            "mtf_core",
            {
                "mtf_core.lowering.masters",
                "mtf_core.lowering.tf_utils",
                "mtf_core.lowering.variables",
            },
        ),
        # get_hardware fits raw profile files: it sits above the calibration
        (
            "cost_models",
            {
                "cost_models.hardware",
                "cost_models.calibration",
                "cost_models.costs",
            },
        ),
        ("cost_models", {"cost_models.op_classes", "cost_models.op_costs"}),
        ("layout_planner", {"layout_planner.cpsat", "layout_planner.solver_process"}),
        # the mesh-shape search calls the per-mesh planner, never the reverse
        (
            "layout_planner",
            {
                "layout_planner.planner",
                "layout_planner.mesh_search",
                "layout_planner.plan_mesh",
            },
        ),
    ],
)
def test_modules_that_used_to_import_each_other_are_not_in_a_cycle(package, modules):
    for cycle in _import_cycles(package):
        assert len(cycle & modules) <= 1, sorted(cycle)


def test_what_runs_in_mtf_core_circles_only_through_operator_overloading():
    # Tensor.__add__ makes an elementwise op, whose family (with the argument
    # checks reduce shares) needs the graph; every other circle is an
    # annotation (if TYPE_CHECKING:).
    overloading = {
        "mtf_core.graph",
        "mtf_core.ops.arguments",
        "mtf_core.ops.creation",
        "mtf_core.ops.elementwise",
        "mtf_core.ops.reduce",
        "mtf_core.ops.unary",
    }
    cycles = _import_cycles("mtf_core", type_checking=False)
    assert cycles and all(c <= overloading for c in cycles), [sorted(c) for c in cycles]


@pytest.mark.parametrize("package", ["cost_models", "layout_planner", "api"])
def test_the_upper_packages_have_no_import_cycle(package):
    # The scale planner's two searches share their value types through
    # layout_planner.scale_plan, so choices -> scale_search is one way.
    assert _import_cycles(package) == []


def test_no_op_family_imports_the_lowering():
    import grimp

    g = grimp.build_graph("mtf_core")
    assert not g.chain_exists("mtf_core.ops", "mtf_core.lowering", as_packages=True)


def _upper_package_names_in_strings(package_dir: Path) -> list[str]:
    """``path:line: 'name'`` for every string (docstrings aside) under
    ``package_dir`` that names an upper package's module: an import by name
    (``importlib.import_module("layout_planner...")``) the linters cannot see."""
    import ast
    import re

    upper = re.compile(r"(layout_planner|cost_models|api)(\.\w+)*")
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            )
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and upper.fullmatch(node.value)
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    return found


def test_mtf_core_names_no_upper_package_even_by_string():
    # The planner's names reach mtf_core (mtf.auto_mtf, and Mesh TF's
    # auto_mtf package in mtf_core.compat) only through mtf_core.extensions.
    assert _upper_package_names_in_strings(ROOT / "mtf_core") == []


def test_mesh_tf_auto_mtf_names_come_from_the_planner_through_the_seam():
    import layout_planner.auto_mtf
    import layout_planner.mesh_tf_layout_optimizer as optimizer
    from mtf_core.compat import auto_mtf
    from mtf_core.compat.auto_mtf import api, layout_optimizer

    assert auto_mtf.layout is api.layout is layout_planner.auto_mtf.layout
    assert (
        auto_mtf.layout_and_mesh_shape is layout_planner.auto_mtf.layout_and_mesh_shape
    )
    assert layout_optimizer.LayoutOptimizer is optimizer.LayoutOptimizer
    with pytest.raises(AttributeError, match="no_such_name"):
        layout_planner.auto_mtf.no_such_name  # noqa: B018
