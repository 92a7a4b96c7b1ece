"""`vitdeploy report`'s page in a real headless browser (Debian's chromium and chromium-driver, driven
by Selenium), opened over file:// with the network refused: no console errors, every image decoded,
every sourced number equal to its JSON, the random-weights banner, the build-engine command when the
bundle has no engine. A screenshot is left in the test's tmp folder."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.report_fixtures import check_numbers, copy_of, evidence_bundle, run_cli  # noqa: F401 (fixture)

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"


def _executables() -> tuple[str, str]:
    browser = next((shutil.which(b) for b in CHROMIUM if shutil.which(b)), None)
    driver = shutil.which(DRIVER) or ("/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists() else None)
    if browser is None or driver is None:
        missing = subprocess.run(["bash", "scripts/install_system_deps.sh", "--check"], capture_output=True, text=True,
                                 cwd=Path(__file__).resolve().parent.parent)
        pytest.fail(f"chromium and chromium-driver are needed for the browser test ({missing.stderr.strip()}); "
                    "install them with: bash scripts/install_system_deps.sh")
    return browser, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = _executables()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,2000",
                 # the network refused: every host name fails to resolve, and any proxy lookup goes nowhere
                 "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
                 "--disable-background-networking", "--disable-component-update", "--no-first-run", "--disable-sync"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # the Debian driver by path: Selenium Manager (which downloads drivers) is never asked
    session = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield session
    finally:
        session.quit()


def open_page(browser: Any, page: Path) -> list[dict[str, Any]]:
    browser.get_log("browser")  # what earlier pages logged
    browser.get(page.as_uri())
    assert browser.execute_script("return document.readyState") == "complete"
    return browser.get_log("browser")


def page_numbers(browser: Any) -> list[tuple[str, str, str, str]]:
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('[data-src]')).map(e => "
        "[e.dataset.src, e.dataset.value, e.dataset.fmt, e.textContent]);")


def test_the_page_in_a_browser_offline(browser: Any, evidence_bundle: Path, tmp_path: Path) -> None:
    bundle = copy_of(evidence_bundle, tmp_path)
    assert run_cli("report", str(bundle)).exit_code == 0
    page = bundle / "reports" / "index.html"
    log = open_page(browser, page)
    assert [e for e in log if e["level"] in ("SEVERE", "ERROR")] == [], log
    # every image decoded, and nothing but inline data was loaded
    images = browser.execute_script("return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.src.slice(0, 22)]);")
    assert len(images) >= 4 and all(done and width > 0 and src.startswith("data:image/png") for done, width, src in images), images
    resources = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name);")
    assert all(not r.startswith(("http:", "https:")) for r in resources), resources
    # what the browser shows is what the JSON holds: check (parity, accuracy), evaluate, profile (latency), manifest, costs
    files = check_numbers(bundle, page_numbers(browser))
    assert {"reports/check.json", "reports/evaluate.json", "reports/profile.json", "manifest.json", "cost-model"} <= files
    shown = browser.find_element("id", "latency").text
    assert "p50 ms" in shown and "verified where" in shown
    assert browser.find_elements("id", "random-weights") == []
    # no engine: the section names the command that builds one, and it is visible
    engines = browser.find_element("id", "no-engines")
    assert engines.is_displayed() and f"vitdeploy build-engine {bundle}" in engines.text
    shot = tmp_path / "report.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


@pytest.fixture(scope="module")
def random_bundle(export_cached: Any) -> Any:
    """The --random-init export tests/test_weights_notice.py makes in the fast tier (shared through the export cache)."""
    return export_cached("timm:vit_tiny_patch16_224", model_kwargs={"depth": 1, "img_size": 32}, num_classes=10, random_init=True,
                         outputs=("logits", "probs", "embedding"), check_images=2)


def test_random_weights_show_the_banner(browser: Any, random_bundle: Any, tmp_path: Path) -> None:
    bundle = copy_of(random_bundle.root, tmp_path)
    result = run_cli("report", str(bundle))
    assert result.exit_code == 0 and "RANDOM" in result.output
    log = open_page(browser, bundle / "reports" / "index.html")
    assert [e for e in log if e["level"] in ("SEVERE", "ERROR")] == [], log
    banner = browser.find_element("id", "random-weights")
    assert banner.is_displayed() and "RANDOM" in banner.text and "--random-init" in banner.text
    colour = browser.execute_script("return getComputedStyle(arguments[0]).color;", banner)
    assert colour.startswith("rgb(207, 34, 46")  # the page's red (--bad)
    assert banner.location["y"] < 300  # at the top, before any section
    browser.save_screenshot(str(tmp_path / "random.png"))
