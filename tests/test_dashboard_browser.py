"""The dashboard in a real headless Chromium (Debian's, driven by Playwright):
the plan page draws the charts and shows the chosen rules, the per-dimension
table and the dimension graph; the form plans another mesh shape.

Set ``MTF_UPDATE_SCREENSHOT=1`` to rewrite docs/img/dashboard.png.
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_cases import ServerThread, service_settings
from services import service_missing

from api.examples import example_graph

pytestmark = [pytest.mark.solver, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "dashboard.png"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(service_settings(tmp_path_factory.mktemp("browser"))) as s:
        yield s


@pytest.fixture(scope="module")
def plan(server: ServerThread) -> dict:
    """A Transformer LM planned on a 2x4 H100 mesh (a plan with splits)."""
    graph = example_graph(
        "transformer-lm", layers=1, d_model=1024, heads=16, d_kv=64, d_ff=4096,
        vocab=32000, length=128, batch=64,
    )  # fmt: skip
    r = httpx.post(
        f"{server.url}/v1/plans",
        json={"graph": graph, "mesh_shape": "x:2;y:4", "hardware": "h100-nvlink-ib"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.fixture(scope="module")
def browser() -> Iterator:
    if not Path(CHROMIUM).exists():
        service_missing(
            f"Debian chromium is not installed at {CHROMIUM} (.ci/run installs it)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


def test_plan_page_draws_the_charts_and_shows_the_chosen_rules(
    server, plan, browser, tmp_path
):
    assert plan["layout_rules"], "the example should split something"
    page = browser.new_page(viewport={"width": 1280, "height": 1800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    page.goto(f"{server.url}/")
    page.click(f"a[href='/plans/{plan['id']}']")
    page.wait_for_selector("body[data-charts-ready='1']", timeout=15_000)
    assert errors == []

    assert page.inner_text("#chosen-rules") == plan["layout_rules"]
    # The chosen rules are highlighted: a background that is not white.
    bg = page.eval_on_selector(
        "#chosen-rules", "e => getComputedStyle(e).backgroundColor"
    )
    assert bg not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)")

    for chart in ("cost-chart", "memory-chart"):
        drawn = page.evaluate(
            """id => {
                const c = document.getElementById(id);
                const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                let inked = 0;
                for (let i = 3; i < px.length; i += 4) if (px[i] > 0) inked++;
                return {w: c.width, h: c.height, inked, chart: !!Chart.getChart(c)};
            }""",
            chart,
        )
        assert drawn["chart"] and drawn["w"] > 200 and drawn["h"] > 100
        assert drawn["inked"] > 2000, drawn  # bars, axes and labels, not a blank canvas
    bars = page.evaluate(
        "() => Chart.getChart(document.getElementById('cost-chart')).data.labels"
    )
    assert len(bars) == len(plan["plan"]["candidates"]) + sum(
        b["cost"] is not None for b in plan["plan"]["baselines"]
    )
    # Labels are never cut: their lines join back to the whole rules.
    assert bars[0][0] == "chosen:"
    assert ";".join(bars[0][1:]) == plan["layout_rules"]
    assert all(len(line) <= 18 or ";" not in line for bar in bars for line in bar)

    # The log scale toggle switches both charts' value axes.
    scale = "id => Chart.getChart(document.getElementById(id)).scales.y.type"
    assert page.evaluate(scale, "cost-chart") == "linear"
    page.check("#log-scale")
    for chart in ("cost-chart", "memory-chart"):
        assert page.evaluate(scale, chart) == "logarithmic"
    page.uncheck("#log-scale")
    assert page.evaluate(scale, "memory-chart") == "linear"

    # Two candidates side by side: the dims they place differently are marked.
    page.select_option("#diff-a", "0")
    page.select_option("#diff-b", "1")
    first, second = plan["plan"]["candidates"][:2]
    differ = {
        d
        for d in {d["name"] for d in plan["plan"]["dims"]}
        if first["rules"].get(d) != second["rules"].get(d)
    }
    assert differ, "the two best layouts should differ somewhere"
    marked = page.eval_on_selector_all(
        "#diff tbody tr.differs", "rows => rows.map(r => r.dataset.dim)"
    )
    assert set(marked) == differ
    assert page.inner_text("#diff-a-name") == "chosen"

    # Collectives by op and memory by tensor are on the page.
    assert page.locator("#op-collectives tbody tr").count() >= 1
    assert page.locator("#peak-tensors tbody tr").count() >= 1

    dims = page.locator("#dims tbody tr")
    assert dims.count() == len(plan["plan"]["dims"])
    split = {d["name"]: d["mesh_axis"] for d in plan["plan"]["dims"] if d["mesh_axis"]}
    for name, axis in split.items():
        assert (
            page.locator(f"#dim-graph g[data-dim='{name}']").get_attribute("data-axis")
            == axis
        )

    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 20_000
    if os.environ.get("MTF_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, SCREENSHOT)
    page.close()


def test_form_plans_the_graph_on_another_mesh_and_shows_the_new_plan(
    server, plan, browser
):
    page = browser.new_page()
    page.goto(f"{server.url}/plans/{plan['id']}")
    page.fill("#try-form input[name=mesh_shape]", "x:4")
    page.select_option("#try-form select[name=hardware]", "tpu-v4")
    page.click("#try-form button[type=submit]")
    # The job page refreshes until the plan is done, then forwards to it.
    page.wait_for_url(f"{server.url}/plans/**", timeout=60_000)
    page.wait_for_selector("body[data-charts-ready='1']", timeout=15_000)
    assert "on x:4 · tpu-v4" in page.inner_text("h1")
    page.close()


def test_api_docs_page_renders_offline_from_vendored_swagger_ui(server, browser):
    page = browser.new_page()
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(r.url))
    page.goto(f"{server.url}/docs")
    page.wait_for_selector(".swagger-ui .opblock", timeout=15_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/v1/plans" in paths and "/v1/jobs/{job_id}" in paths
    assert failed == []  # nothing fetched from outside
    page.close()


#: Markup that runs a script wherever a value is put into a page unescaped:
#: elements with event handlers, a script element, and both quotes to leave
#: an attribute value.  No "/": in a path it would split the segment.
XSS = """<img src=x onerror="window.__xss=1;alert(1)">'"><svg onload="alert(2)"><script>alert(3)"""


def _no_script_ran(page, dialogs: list[str]) -> None:
    assert dialogs == []
    assert page.evaluate("() => window.__xss === undefined")
    # The markup is shown as text, never made into elements.
    assert page.locator("img[src=x]").count() == 0
    assert page.locator("svg[onload]").count() == 0
    assert page.evaluate(
        "() => [...document.scripts].every(s => s.src || s.type === 'application/json')"
    )


def test_no_path_or_form_value_runs_a_script_in_the_browser(server, plan, browser):
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    quoted = urllib.parse.quote(XSS, safe="")

    # Path parameters: the not-found pages echo the id (escaped).
    for path in (f"/plans/{quoted}", f"/jobs/{quoted}"):
        r = page.goto(server.url + path)
        assert r is not None and r.status == 404
        assert page.inner_text("#missing-id") == XSS
        _no_script_ran(page, dialogs)

    # Form fields: every one of the try form's fields (and the form of a
    # plan that does not exist), posted by the browser itself.
    fields = ("mesh_shape", "num_devices", "hardware", "objective", "token")
    for plan_id in (plan["id"], XSS):
        for field in fields:
            page.goto(f"{server.url}/plans/{plan['id']}")
            page.evaluate(
                """([action, field, value]) => {
                    const f = document.getElementById('try-form');
                    f.action = action;
                    let input = f.querySelector(`[name="${field}"]`);
                    if (!input || input.tagName !== 'INPUT') {
                        if (input) input.remove();
                        input = document.createElement('input');
                        input.name = field;
                        f.appendChild(input);
                    }
                    input.value = value;
                    if (field !== 'mesh_shape') f.querySelector('[name=mesh_shape]').value = '';
                }""",
                [f"/plans/{urllib.parse.quote(plan_id, safe='')}/try", field, XSS],
            )
            with page.expect_navigation():
                page.click("#try-form button[type=submit]")
            _no_script_ran(page, dialogs)
            text = page.inner_text("main")
            if plan_id == XSS:
                assert page.inner_text("#missing-id") == XSS
            elif field in ("mesh_shape", "num_devices", "hardware", "objective"):
                # The form's error names the value, as text.
                assert page.locator("#form-error").count() == 1, (field, text)
    page.close()
