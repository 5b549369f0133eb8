"""``lit-rag report``'s index.html in a real headless browser (Debian's Chromium, driven by
Playwright): the plots load, the rollouts render, and model text stays text (slow: 25-45 s
on 2 cores).

The run is a real ``lit-rag fit --config recipes/tiny.yaml`` (random 2-layer model, 2 steps,
RolloutSampleLogger with prompts) into whose rollouts.jsonl two rows of hostile model output are
appended; then the real ``lit-rag report`` writes the page, opened by file:// with JavaScript on.

Needs ``apt-get install chromium`` (/usr/bin/chromium; Playwright's own browser download is not
used) and ``pip install playwright`` (the ``dev`` extra); ``.ci/run`` installs both.

The test writes a screenshot of the page it checked to ``$LIT_RAG_REPORT_SCREENSHOT`` when set.
Run as a script, the module screenshots the top HEIGHT pixels (default 1600) of the report of
any run, 1200 px wide (the docs' image: the plots and the first two rollouts of the quickstart)::

    python tests/report/test_report_browser.py runs/quickstart/version_0 \
        docs/images/report.png 2410
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

CHROMIUM = "/usr/bin/chromium"

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml")
#: Chromium flags that work offline, as root, without a display or a GPU
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: model output that would run script, add elements or break the page's tables if not escaped
HOSTILE = (
    "<script>window.__pwned=1</script>"
    '<img src=x onerror="window.__pwned=1">'
    "</td></tr></table></div></section>"
    '<svg onload="window.__pwned=1"></svg>'
    '<iframe src="javascript:top.__pwned=1"></iframe>'
    "<style>body{display:none}</style><!-- & &amp; \"'"
)


def lit_rag(*args: str, cwd: Path) -> str:
    """Run the real ``lit-rag`` command (``python -m lit_rag``); its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "lit_rag", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def hostile_rows(last: dict) -> list[dict]:
    """Two rows like RolloutSampleLogger's, at the last logged step: a single-turn completion
    with an ``<information>`` block (which the page marks as inserted), and a multi-turn one with
    ``segments``, ``steps`` and a prompt; hostile text in every field the page shows."""
    plain = {
        **last,
        "example_id": "hostile-1" + HOSTILE,
        "completion": f"A{HOSTILE}<information>doc {HOSTILE}</information>Z{HOSTILE}",
        "answers": [HOSTILE],
        "prompt": "Question: " + HOSTILE,
    }
    segments = [
        {"text": "<search>" + HOSTILE + "</search>", "inserted": False},
        {"text": "<information>" + HOSTILE + "</information>", "inserted": True},
        {"text": "<answer>" + HOSTILE + "</answer>", "inserted": False},
    ]
    multi = {
        **last,
        "example_id": "hostile-2",
        "completion": "".join(s["text"] for s in segments),
        "segments": segments,
        "steps": [{"action": "search", "query": HOSTILE, "passage_ids": ["d1"]}],
        "answers": ["x"],
    }
    return [plain, multi]


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    """A tiny run's report folder; rollouts.jsonl holds the real rows and two hostile ones."""
    # Checked when a test runs, not when the module is collected: the default run (not slow)
    # collects this module before CI has installed Chromium for the slow tests.
    from helpers import require_executable, require_package

    require_package("playwright", "pip install 'lit-rag[dev]' (or pip install playwright)")
    require_executable(CHROMIUM, "apt-get install -y chromium")
    root = tmp_path_factory.mktemp("run")
    lit_rag(
        "fit",
        "--config",
        RECIPE,
        "--trainer.default_root_dir",
        str(root),
        "--trainer.callbacks+=lit_rag.callbacks.RolloutSampleLogger",
        "--trainer.callbacks.include_prompt=true",
        "--trainer.val_check_interval=2",
        cwd=root,  # the recipe's save_dir: runs
    )
    run = root / "runs" / "tiny" / "version_0"
    rollouts = run / "rollouts.jsonl"
    rows = [json.loads(line) for line in rollouts.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 8, rows  # steps 1 and 2, 4 rows each (batch 2 x group 2)
    with rollouts.open("a", encoding="utf-8") as f:
        for row in hostile_rows(rows[-1]):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    printed = lit_rag("report", str(run), cwd=root)
    assert f"wrote 10 files to {run / 'report'}:" in printed, printed  # 8 plots and 2 pages
    return run / "report"


class Browser:
    """A headless Chromium page on ``url`` that records console errors, page errors (uncaught
    exceptions) and every request it made."""

    def __init__(self, playwright, width: int = 1200, height: int = 1600) -> None:
        self.browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        self.page = self.browser.new_page(viewport={"width": width, "height": height})
        self.page.set_default_timeout(30_000)
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.failed: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("requestfailed", lambda r: self.failed.append(r.url))

    def open(self, index: Path) -> None:
        self.page.goto(index.resolve().as_uri(), wait_until="load")

    def screenshot(self, path: str | Path, height: int = 1600) -> None:
        """The page's top ``height`` pixels at the viewport's width, as PNG."""
        width = self.page.viewport_size["width"]
        full = self.page.evaluate("document.documentElement.scrollHeight")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(
            path=str(path),
            full_page=True,
            clip={"x": 0, "y": 0, "width": width, "height": min(height, full)},
        )

    def close(self) -> None:
        self.browser.close()


def test_report_page_in_chromium(report_dir: Path) -> None:
    from playwright.sync_api import sync_playwright

    index = report_dir / "index.html"
    pngs = sorted(p.name for p in report_dir.glob("*.png") if p.name != "health.png")
    rows = [json.loads(line) for line in (report_dir.parent / "rollouts.jsonl").open()]
    with sync_playwright() as playwright:
        browser = Browser(playwright)
        try:
            browser.open(index)
            page = browser.page
            # every plot loaded and decoded, and is laid out on screen
            images = page.evaluate(
                """() => [...document.images].map(i => ({src: i.getAttribute('src'),
                    complete: i.complete, width: i.naturalWidth, shown: i.clientWidth}))"""
            )
            assert sorted(i["src"] for i in images) == pngs, images
            for image in images:
                assert image["complete"] and image["width"] > 0 and image["shown"] > 0, image
            # every rollout renders: a block with its own 2-row table, in its step's section
            blocks = page.locator("div.rollout")
            assert blocks.count() == len(rows) == 10
            for i in range(blocks.count()):
                assert blocks.nth(i).is_visible()
            assert page.locator("div.rollout > table").count() == len(rows)
            assert page.locator("div.rollout > table tr").count() == 2 * len(rows)
            assert page.locator("body > section").count() == len({r["step"] for r in rows})
            assert page.locator("section#step-2 > div.rollout").count() == 6  # 4 + 2 hostile
            # model text is text: literally in the page, each completion exactly
            text = page.evaluate("document.body.textContent")
            # one row's id, completion (x3), answers and prompt; the other's segments (x3), query
            assert text.count(HOSTILE) == 10, text
            completions = page.locator("div.rollout > div.completion").all_text_contents()
            assert completions == [r["completion"] for r in rows]
            assert page.locator("div.rollout details div.completion").count() == len(rows)
            inserted = page.locator("span.inserted").all_text_contents()
            assert inserted == [f"<information>doc {HOSTILE}</information>"] + [
                f"<information>{HOSTILE}</information>"
            ]
            # nothing ran, and model text made no element and fetched nothing
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert page.evaluate("document.scripts.length") == 0
            assert page.locator("svg, iframe, script, body style").count() == 0
            assert page.locator("[onerror], [onload]").count() == 0
            assert page.locator("body").is_visible()
            assert browser.errors == [], browser.errors
            assert browser.failed == [], browser.failed
            fetched = sorted(Path(url.removeprefix("file://")).name for url in browser.requests)
            assert fetched == sorted(["index.html", *pngs]), browser.requests
            if os.environ.get("LIT_RAG_REPORT_SCREENSHOT"):
                browser.screenshot(os.environ["LIT_RAG_REPORT_SCREENSHOT"])
        finally:
            browser.close()


def test_health_page_in_chromium(report_dir: Path) -> None:
    """The run-health page: its plot loads, it links back to the report, and it fetches nothing
    else and runs nothing."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = Browser(playwright)
        try:
            browser.open(report_dir / "health.html")
            page = browser.page
            images = page.evaluate(
                """() => [...document.images].map(i => ({src: i.getAttribute('src'),
                    complete: i.complete, width: i.naturalWidth, shown: i.clientWidth}))"""
            )
            assert [i["src"] for i in images] == ["health.png"], images
            assert images[0]["complete"] and images[0]["width"] > 0 and images[0]["shown"] > 0
            assert page.locator('a[href="index.html"]').count() == 1
            assert page.evaluate("document.scripts.length") == 0
            assert browser.errors == [], browser.errors
            assert browser.failed == [], browser.failed
            fetched = sorted(Path(url.removeprefix("file://")).name for url in browser.requests)
            assert fetched == ["health.html", "health.png"], browser.requests
        finally:
            browser.close()
    index = (report_dir / "index.html").read_text(encoding="utf-8")
    assert 'href="health.html"' in index


def screenshot_run(run_dir: str, png: str, height: int = 1600) -> None:
    """``lit-rag report RUN_DIR`` into a temporary folder, then its page's top ``height``
    pixels at 1200 px wide to ``png``."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as out:
        print(lit_rag("report", run_dir, "--out", out, cwd=Path.cwd()), end="")
        with sync_playwright() as playwright:
            browser = Browser(playwright)
            try:
                browser.open(Path(out) / "index.html")
                browser.screenshot(png, height)
                assert browser.errors == [], browser.errors
            finally:
                browser.close()
    print(f"wrote {png}")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(f"usage: python {sys.argv[0]} RUN_DIR OUT.png [HEIGHT]")
    screenshot_run(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))
