"""A real browser on the app: Debian's Chromium, headless, driven by Playwright's Python package.

No browser is downloaded: Playwright is pointed at the binary of Debian's ``chromium`` package
(``apt-get install -y chromium``, which ``.ci/run`` does). Without it these tests skip, saying so.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.app.conftest import TINY_PROMPT, generation_threads, slow_app, wait_until

pytestmark = pytest.mark.single_version  # the page in Chromium: CI runs it on 5.x only

CHROMIUM = Path(os.environ.get("HFS_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture
def browser_page(tmp_path):
    """A fresh headless Chromium page (its own --user-data-dir under the test's tmp dir)."""
    if not CHROMIUM.exists():
        pytest.skip(f"Debian's Chromium is not installed at {CHROMIUM} (apt-get install -y chromium; .ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is not installed")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1600, "height": 1200},
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def open_app(page, url: str) -> None:
    """Load the page and wait until the app is mounted: Gradio mounts it after the load event, and text
    typed before then never reaches the app's state (seen with gradio 6.17 on a loaded machine)."""
    page.goto(url)
    page.wait_for_load_state("networkidle")


def run_comparison(page, url: str, prompt: str, timeout_s: float = 60) -> str:
    """Open the page, type ``prompt``, press Generate and wait for the end; returns the status text."""
    open_app(page, url)
    page.locator("#hfs-prompt textarea").fill(prompt)
    page.locator("#hfs-run").click()
    # the end of a run, or a message: fail fast with what the page says rather than time out
    page.wait_for_function(
        "() => { const t = document.querySelector('#hfs-status')?.innerText || '';"
        " return t.includes('Done:') || t.includes('⚠️'); }",
        timeout=timeout_s * 1000,
    )
    return page.locator("#hfs-status").inner_text()


def check_page(page, methods: list[str]) -> dict:
    """Assert what the page shows after a greedy comparison of ``methods``; returns pane texts."""
    texts = {}
    for i, name in enumerate(["greedy", *methods]):
        pane = page.locator(f"#hfs-pane-{i} .hfs-pane")
        assert pane.get_attribute("data-method") == name
        assert pane.get_attribute("data-status") == "done", pane.inner_text()
        figures = pane.locator(".hfs-figures").inner_text()
        assert "tok/s" in figures and "τ " in figures and "target forwards" in figures, figures
        texts[name] = pane.locator(".hfs-text").inner_text()
        if i:
            assert pane.locator("[data-identical]").get_attribute("data-identical") == "yes"
            assert "identical to greedy" in pane.locator(".hfs-badge").inner_text()
    for name in methods:
        assert texts[name] == texts["greedy"] and texts[name].strip()
    # the figure arrives with the last update and is drawn as an image right after it
    page.locator("#hfs-plot img").first.wait_for(state="visible", timeout=30_000)
    assert "CPU" in page.locator("#hfs-device").inner_text() or "GPU" in page.locator("#hfs-device").inner_text()
    return texts


def test_page_runs_a_comparison_and_shows_it(browser_page, served_app, tmp_path):
    page, url = browser_page, served_app[0]
    status = run_comparison(page, url, TINY_PROMPT)
    assert "Done: 3/3" in status, status
    check_page(page, ["prompt-lookup", "hf-prompt-lookup"])
    assert page.locator("#hfs-pane-1 .hfs-draft").count() > 0, "accepted drafts are highlighted"
    shot = tmp_path / "app.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000


def test_a_bad_request_shows_a_message_in_the_page(browser_page, served_app):
    page = browser_page
    open_app(page, served_app[0])
    page.locator("#hfs-prompt textarea").fill("   ")
    page.locator("#hfs-run").click()
    page.locator("#hfs-status").filter(has_text="The prompt is empty").wait_for(timeout=30_000)
    assert "Traceback" not in page.content()


SCROLLING = """() => [...document.querySelectorAll('*')].filter(el => {
    const style = getComputedStyle(el), shown = el.offsetParent !== null;
    const across = el.scrollWidth > el.clientWidth + 1 && ['auto', 'scroll'].includes(style.overflowX);
    return shown && across;
}).map(el => (el.id || el.className.toString().slice(0, 40)) + ': ' + (el.innerText || '').slice(0, 40))"""


@pytest.mark.parametrize("width", [1600, 1280, 1024])
def test_no_control_scrolls_sideways(browser_page, served_app, width):
    """The Temperature slider's label, number box and reset button once needed 171 px in a 160 px block: a stray
    scrollbar under it. No block of the page scrolls sideways, at a wide or a narrow window."""
    page = browser_page
    page.set_viewport_size({"width": width, "height": 1000})
    open_app(page, served_app[0])
    page.locator("#hfs-temperature").wait_for(timeout=30_000)
    assert page.evaluate(SCROLLING) == []


def test_closing_the_page_stops_the_generation(browser_page, tiny_chat_dir):
    page = browser_page
    with slow_app(tiny_chat_dir) as (url, forwards):
        open_app(page, url)
        page.locator("#hfs-prompt textarea").fill(TINY_PROMPT)
        page.locator("#hfs-run").click()
        assert wait_until(lambda: len(forwards) > 5, 60), (
            f"the generation never started; the page says: {page.locator('#hfs-status').inner_text()!r}")
        page.close()  # the visitor leaves
        # greedy alone takes 400 x 20 ms = 8 s: still running 4 s after the page closed = not stopped
        assert wait_until(lambda: not generation_threads(), 4), "the generation kept running after the page closed"
        assert len(forwards) < 250


def test_options_show_for_ticked_methods_only_blank_means_default_and_three_at_most(browser_page, served_app):
    page = browser_page
    open_app(page, served_app[0])
    page.locator("#hfs-options").click()  # the accordion
    shown = page.locator("#hfs-options-prompt_lookup").first  # gradio 6 nests two divs with a Group's id
    shown.wait_for(state="visible", timeout=10_000)
    assert page.locator("#hfs-options-eagle").first.is_hidden(), "options of methods not ticked are hidden"
    fields = shown.locator("input[type=text], textarea")
    assert fields.count() == 2 and all(fields.nth(i).input_value() == "" for i in range(2)), "blank, not 0"
    assert all(fields.nth(i).get_attribute("placeholder") == "default" for i in range(2))
    methods = page.locator("#hfs-methods")
    methods.get_by_label("EAGLE (hfs)", exact=True).check()
    page.locator("#hfs-options-eagle").first.wait_for(state="visible", timeout=10_000)
    methods.get_by_label("SuffixDecoding (hfs)", exact=True).click()  # a fourth: undone at once, with a message
    assert wait_until(lambda: methods.locator("input:checked").count() == 3
                      and not methods.get_by_label("SuffixDecoding (hfs)", exact=True).is_checked(), 10)
    page.get_by_text("At most 3 methods").first.wait_for(timeout=10_000)
    # a method the model cannot run is not tickable, and says why
    off = page.locator("#hfs-methods-off .hfs-off-item", has_text="Medusa (hfs)").first
    assert off.locator("input").is_disabled() and "no trained set of Medusa heads ships for tiny-chat" in (
        off.get_attribute("title"))
    assert methods.get_by_label("Medusa (hfs)", exact=True).count() == 0


def test_stop_says_stopped_in_the_status_and_the_panes(browser_page, tiny_chat_dir):
    page = browser_page
    with slow_app(tiny_chat_dir) as (url, forwards):
        open_app(page, url)
        stop = page.locator("#hfs-stop")
        assert stop.is_disabled() and "stop" not in (stop.get_attribute("class") or "").split(), "grey while idle"
        page.locator("#hfs-prompt textarea").fill(TINY_PROMPT)
        page.locator("#hfs-run").click()
        assert wait_until(lambda: len(forwards) > 5, 60), page.locator("#hfs-status").inner_text()
        assert wait_until(lambda: stop.is_enabled(), 10) and "stop" in stop.get_attribute("class").split()
        stop.click()
        page.locator("#hfs-status").filter(has_text="Stopped.").wait_for(timeout=30_000)
        status = page.locator("#hfs-status").inner_text()
        assert "Running" not in status and "cut short: Greedy (baseline)" in status, status
        assert "not run: Prompt lookup (transformers)" in status, status
        greedy, other = page.locator("#hfs-pane-0 .hfs-pane"), page.locator("#hfs-pane-1 .hfs-pane")
        assert greedy.get_attribute("data-status") == "cancelled" and "stopped after" in greedy.inner_text()
        assert other.get_attribute("data-status") == "cancelled" and "stopped before it ran" in other.inner_text()
        assert "waiting" not in other.inner_text()
        assert wait_until(lambda: stop.is_disabled(), 10), "grey again once stopped"
        assert wait_until(lambda: not generation_threads(), 5)


SHOTS = ("app-first-load.png", "app-run.png", "app-stopped.png", "app-sampling.png")


@pytest.mark.integration
def test_default_model_in_the_browser(browser_page, tmp_path):
    """The page on the real default model (smollm2-135m-instruct): first load, a run, a stopped run and a sampling
    run. The screenshots are the ones the docs show: set ``HFS_APP_SCREENSHOTS`` to a folder to keep them there."""
    from hf_speculative.app.cache import ModelCache
    from hf_speculative.app.examples import EXAMPLES
    from hf_speculative.app.ui import build_app
    from tests.conftest import launch_local

    demo = build_app(ModelCache(), default_max_new_tokens=96)
    url, _ = launch_local(demo)
    shots = {name: tmp_path / name for name in SHOTS}
    try:
        page = browser_page
        open_app(page, url)
        # count() does not wait: wait for the list first (a loaded machine renders the page late)
        page.locator("#hfs-methods-off").get_by_text("Draft model (hfs)").wait_for(timeout=60_000)
        assert page.locator("#hfs-methods-off").get_by_text("Draft model (hfs)").count() == 1
        page.screenshot(path=str(shots["app-first-load.png"]), full_page=True)

        status = run_comparison(page, url, EXAMPLES["answer from a context"], timeout_s=240)
        assert "smollm2-135m-instruct" in status and "Done: 3/3" in status, status
        texts = check_page(page, ["prompt-lookup", "hf-prompt-lookup"])
        assert "330" in texts["greedy"], texts["greedy"]  # a sensible answer: the height from the context
        page.screenshot(path=str(shots["app-run.png"]), full_page=True)

        page.locator("#hfs-prompt textarea").fill(EXAMPLES["story (try sampling)"])
        page.locator("#hfs-run").click()
        page.locator("#hfs-pane-1 .hfs-pane[data-status=running]").wait_for(timeout=120_000)
        page.wait_for_timeout(1500)
        page.locator("#hfs-stop").click()
        page.locator("#hfs-status").filter(has_text="Stopped.").wait_for(timeout=60_000)
        page.screenshot(path=str(shots["app-stopped.png"]), full_page=True)

        page.locator("#hfs-sample input").check()
        page.locator("#hfs-run").click()
        page.wait_for_function(
            "() => { const t = document.querySelector('#hfs-status')?.innerText || '';"
            " return t.includes('Done:') || t.includes('⚠️'); }", timeout=240_000)
        assert "Done: 3/3" in page.locator("#hfs-status").inner_text()
        first = page.locator("#hfs-pane-0 .hfs-pane")
        assert "Plain sampling (baseline)" in first.inner_text() and "Greedy" not in first.inner_text()
        assert "identical to plain sampling" in page.locator("#hfs-pane-1 .hfs-badge").inner_text()
        page.locator("#hfs-plot img").first.wait_for(state="visible", timeout=30_000)
        page.screenshot(path=str(shots["app-sampling.png"]), full_page=True)
        if os.environ.get("HFS_APP_SCREENSHOTS"):
            for name, path in shots.items():
                shutil.copy(path, Path(os.environ["HFS_APP_SCREENSHOTS"]) / name)
    finally:
        demo.close()
