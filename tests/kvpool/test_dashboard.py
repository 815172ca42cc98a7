"""kvpool/dashboard.py over real HTTP on 127.0.0.1, and the page itself in a real headless Chromium.

History is made deterministic by a fake clock and explicit `sample()` calls (sample_interval=None), never by sleeping.
The browser test drives the page with a real EmbeddedPool under RAG-style traffic (lookup, then save the missed
blocks) and checks the page against the token counts the CLIENTS observed (sum of lookup_prefix results).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kvpool import EmbeddedPool, Namespace, block_keys
from kvpool.dashboard import DashboardServer
from kvpool.metrics import PoolMetrics
from kvpool.store.stats import PoolStats

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


class Clock:
    def __init__(self, t: float = 1_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Counters:
    """A stats provider in the master's shape whose counters the test moves by hand."""

    def __init__(self):
        self.stats = {"nodes": {"n1": {"dram": {"objects": 0, "bytes": 0, "capacity": 1 << 20},
                                       "ssd": {"objects": 0, "bytes": 0, "capacity": 1 << 22}}},
                      "namespaces": {"m/default": {"requested_tokens": 0, "hit_tokens": 0,
                                                   "hit_tokens_by_tier": {"hbm": 0, "dram": 0, "ssd": 0}}},
                      "lookups": 0, "requested_tokens": 0, "hit_tokens": 0,
                      "hit_tokens_by_tier": {"hbm": 0, "dram": 0, "ssd": 0}, "puts": {"stored": 0}}
        self.fail = False

    def __call__(self):
        if self.fail:
            raise ConnectionError("master unreachable")
        return json.loads(json.dumps(self.stats))  # a fresh copy, as an RPC answer would be

    def traffic(self, requested: int, dram: int, ssd: int, stored: int = 0) -> None:
        for c in (self.stats, self.stats["namespaces"]["m/default"]):
            c["requested_tokens"] += requested
            c["hit_tokens"] += dram + ssd
            c["hit_tokens_by_tier"]["dram"] += dram
            c["hit_tokens_by_tier"]["ssd"] += ssd
        self.stats["lookups"] += 1
        self.stats["puts"]["stored"] += stored


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


@pytest.fixture
def dash():
    counters, clock = Counters(), Clock()
    registry = CollectorRegistry()
    PoolMetrics.create(registry, counters)
    server = DashboardServer(counters, registry, sample_interval=None, window=2, history_points=4, clock=clock)
    with server:
        yield server, counters, clock


def test_routes_serve_page_stats_metrics_health(dash):
    server, counters, _ = dash
    counters.traffic(requested=64, dram=16, ssd=8)
    status, ctype, body = get(server.url)
    assert (status, ctype) == (200, "text/html; charset=utf-8")
    assert b'id="hit-rate-value"' in body and b"/static/dashboard.js" in body
    assert b"http://" not in body and b"https://" not in body  # nothing fetched from outside (offline clusters)
    for name, ctype_want in (("dashboard.js", "text/javascript; charset=utf-8"),
                             ("dashboard.css", "text/css; charset=utf-8")):
        status, ctype, body = get(server.url + "static/" + name)
        assert (status, ctype) == (200, ctype_want)
        assert body == (ROOT / "kvpool" / "static" / name).read_bytes()
    status, ctype, body = get(server.url + "api/stats")
    assert (status, ctype) == (200, "application/json")
    stats = json.loads(body)
    assert stats == {**counters(), "hit_rate": 0.375, "nodes_alive": 1, "active_tiers": ["dram", "ssd"]}
    status, ctype, body = get(server.url + "metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert 'kvpool_hit_tokens_total{namespace="m/default",tier="ssd"} 8.0' in body.decode().splitlines()
    assert get(server.url + "health")[::2] == (200, b'{"status": "ok"}')


@pytest.mark.parametrize("path, status, error", [
    ("nope", 404, "not found: /nope"),
    ("static/../dashboard.py", 404, "not found: /static/../dashboard.py"),
    ("static/missing.js", 404, "not found: /static/missing.js"),
    ("api/history?limit=abc", 400, "limit: expected an integer in [1, 86400], got 'abc'"),
    ("api/history?limit=0", 400, "limit: expected an integer in [1, 86400], got '0'"),
    ("api/history?limit=86401", 400, "limit: expected an integer in [1, 86400], got '86401'"),
    ("api/history?since=nan", 400, "since: expected a unix time in seconds, got 'nan'"),
    ("api/history?since=x", 400, "since: expected a unix time in seconds, got 'x'"),
    ("api/history?limit=1&limit=2", 400, "limit: given more than once"),
    ("api/history?window=3", 400, "window: unknown query parameter; allowed: since, limit"),
    ("api/stats?verbose=1", 400, "verbose: unknown query parameter; allowed: none"),
])
def test_bad_routes_and_params_answer_json_errors(dash, path, status, error):
    server = dash[0]
    got_status, ctype, body = get(server.url + path)
    assert (got_status, ctype, json.loads(body)["error"]) == (status, "application/json", error)
    if status == 400:
        assert json.loads(body)["param"] == error.split(":")[0]


def test_failure_inside_a_route_is_500_json():
    class Broken:
        def collect(self):
            raise RuntimeError("collector exploded")

    registry = CollectorRegistry()
    registry.register(Broken())
    with DashboardServer(Counters(), registry, sample_interval=None) as server:
        status, ctype, body = get(server.url + "metrics")
        assert (status, ctype, json.loads(body)) == (500, "application/json",
                                                      {"error": "RuntimeError: collector exploded"})
        assert get(server.url + "health")[0] == 200  # the server itself is fine


def test_post_is_405(dash):
    req = urllib.request.Request(dash[0].url + "api/stats", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405
    assert json.loads(e.value.read()) == {"error": "method POST not allowed; use GET"}


def test_history_rates_over_the_window_exact(dash):
    server, counters, clock = dash
    assert server.sample() is None  # first sample: a baseline, no rate yet
    clock.t += 1
    counters.traffic(requested=100, dram=50, ssd=25, stored=4)
    p1 = server.sample()
    assert p1 == {"t": 1001.0, "hit_rate": {"all": 0.75, "dram": 0.5, "ssd": 0.25},
                  "requested_tokens_per_s": 100.0, "hit_tokens_per_s": 75.0, "lookups_per_s": 1.0,
                  "stored_per_s": 4.0}
    clock.t += 1
    counters.traffic(requested=300, dram=0, ssd=0)
    p2 = server.sample()  # window=2 samples: compares against t=1000
    assert p2["hit_rate"] == {"all": 75 / 400, "dram": 50 / 400, "ssd": 25 / 400}
    assert p2["requested_tokens_per_s"] == 200.0
    clock.t += 1
    p3 = server.sample()  # window now t=1001..1003: 300 requested, 0 hits
    assert p3["hit_rate"] == {"all": 0.0, "dram": 0.0, "ssd": 0.0}
    clock.t += 1
    p4 = server.sample()  # t=1002..1004: nothing requested -> no hit rate (null), not 0%
    assert p4["hit_rate"] == {"all": None, "dram": None, "ssd": None}
    assert p4["requested_tokens_per_s"] == 0.0
    status, _, body = get(server.url + "api/history")
    assert status == 200 and json.loads(body) == {"points": [p1, p2, p3, p4], "interval": None, "window": 2}
    assert json.loads(get(server.url + "api/history?since=1002&limit=1")[2])["points"] == [p4]
    assert json.loads(get(server.url + "api/history?since=1001.5")[2])["points"] == [p2, p3, p4]
    assert json.loads(get(server.url + "api/history?limit=100")[2])["points"] == [p1, p2, p3, p4]
    clock.t += 1
    server.sample()
    assert [p["t"] for p in server.history.points()] == [1002.0, 1003.0, 1004.0, 1005.0]  # ring of 4


def test_counter_reset_restarts_the_window(dash):
    server, counters, clock = dash
    counters.traffic(requested=1000, dram=1000, ssd=0)
    server.sample()
    counters.stats["requested_tokens"] = 10  # the master restarted: counters start again from 0
    counters.stats["hit_tokens_by_tier"] = {"dram": 5, "ssd": 0}
    clock.t += 1
    assert server.sample() is None
    clock.t += 1
    counters.traffic(requested=10, dram=0, ssd=5)
    assert server.sample()["hit_rate"] == {"all": 0.5, "dram": 0.0, "ssd": 0.5}


def test_unreachable_pool_is_503_and_page_keeps_serving(dash):
    server, counters, _ = dash
    counters.fail = True
    status, _, body = get(server.url + "api/stats")
    assert (status, json.loads(body)) == (503, {"error": "stats unavailable: master unreachable"})
    assert get(server.url)[0] == 200
    assert get(server.url + "health")[0] == 200
    assert "kvpool_nodes_alive" in get(server.url + "metrics")[2].decode()  # event metrics + empty families


def test_sampler_thread_fills_history_and_survives_provider_errors():
    counters = Counters()
    counters.fail = True
    ticks = []

    def provider():
        ticks.append(1)
        if len(ticks) >= 3:
            counters.fail = False
        return counters()

    server = DashboardServer(provider, CollectorRegistry(), sample_interval=0.01)
    pause = threading.Event()
    with server:
        for _ in range(2000):  # bounded: the thread must produce two good samples (one point)
            if server.history.points():
                break
            pause.wait(0.01)
    assert len(server.history.points()) >= 1
    assert len(ticks) >= 4  # two failures, then at least two good samples
    assert not [t for t in threading.enumerate() if t.name.startswith("kvpool-dashboard")]  # stop() joined them


@pytest.mark.parametrize("kwargs, message", [
    ({"port": -1}, r"port must be an int in \[0, 65535\], got -1"),
    ({"sample_interval": 0}, r"sample_interval must be a positive number of seconds or None, got 0"),
    ({"window": 0}, r"window must be a positive int \(samples\), got 0"),
    ({"history_points": 0}, r"history_points must be a positive int, got 0"),
])
def test_constructor_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DashboardServer(Counters(), CollectorRegistry(), **kwargs)
    with pytest.raises(ValueError, match="stats_provider must be callable"):
        DashboardServer({"nodes": {}}, CollectorRegistry())


# ---- the page in a real browser ---------------------------------------------------------------------------------

NAMESPACES = [  # tiny layouts: one block of 16 tokens is 2 KiB; DRAM holds about half the working set
    Namespace(model="smollm2-135m", fingerprint="w1", kv_dtype="float32", block_tokens=16, num_layers=2,
              num_kv_heads=1, head_dim=8),
    Namespace(model="smollm2-135m", fingerprint="w1", kv_dtype="float32", block_tokens=16, num_layers=2,
              num_kv_heads=1, head_dim=8, tenant="team-b"),
    Namespace(model="llama-3.2-1b", fingerprint="w2", kv_dtype="float16", block_tokens=16, num_layers=2,
              num_kv_heads=2, head_dim=8),
]


def prompt(ns_index: int, step: int) -> list[int]:
    """A RAG-style prompt: shared system prefix (4 blocks) + one of 12 documents (5-7 blocks) + a fresh question."""
    doc = (step * 7 + ns_index * 3) % 12 if ns_index != 2 else step % 40  # namespace 2 rarely repeats a document
    system = [ns_index * 10_000 + j for j in range(64)]
    document = [1_000_000 + doc * 1_000 + j for j in range(80 + 16 * (doc % 3))]
    question = [5_000_000 + step * 100 + j for j in range(40)]
    return system + document + question


def run_traffic(pool: EmbeddedPool, server: DashboardServer, clock: Clock, steps: int) -> tuple[int, int]:
    """Each step, every namespace loads the leading blocks of its prompt that the pool has, then saves the blocks
    it missed (as the connector does after prefill); then the dashboard samples. Returns (requested, hit) tokens
    as the CLIENTS saw them."""
    requested = hit = 0
    for step in range(steps):
        for i, ns in enumerate(NAMESPACES):
            if i == 1 and step % 2:  # team-b sends half the traffic
                continue
            keys = block_keys(ns, prompt(i, step))
            n = pool.get_many_into(keys, [bytearray(ns.block_bytes) for _ in keys], namespace=ns)
            requested += len(keys) * ns.block_tokens
            hit += n * ns.block_tokens
            pool.put_many(keys[n:], [bytes([step % 256]) * ns.block_bytes] * (len(keys) - n), namespace=ns)
        clock.t += 1
        server.sample()
    return requested, hit


def fmt_pct(num: int, den: int) -> str:
    text = f"{100 * num / den:.1f}%"
    # JS toFixed rounds exact binary ties up, Python to even: make sure this value is not such a tie.
    assert (100 * num / den * 10) % 1 != 0.5, "pick traffic whose hit rate is not an exact .x5 tie"
    return text


def fmt_seconds(x: float) -> str:
    """dashboard.js fmtSeconds."""
    return f"{x:.2f} s" if x < 100 else f"{x / 60:.1f} min" if x < 6000 else f"{x / 3600:.1f} h"


def fmt_bytes(n: int) -> str:
    """dashboard.js fmtBytes."""
    units, i, x = ["B", "KiB", "MiB", "GiB", "TiB"], 0, float(n)
    while x >= 1024 and i < len(units) - 1:
        x, i = x / 1024, i + 1
    return f"{n} B" if i == 0 else f"{x:.1f} {units[i]}"


def _chrome_or_skip():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        pytest.skip(f"browser test needs {' and '.join(missing)} (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="browser test needs selenium (dev extra)")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="kvpool-chromium-")
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", f"--user-data-dir={profile}", "--window-size=1440,1000"):
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    return driver, profile


def check_dashboard_page(driver, url: str, stats: dict) -> PoolStats:
    """Load the dashboard at `url` and check every number it shows against `stats`, the raw dict that
    `pool.stats()` / `kvpool stats --json` return. Written for any pool: point it at `kvpool up` the same way
    (stop the traffic first, so the page and `stats` see the same counters)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    snap = PoolStats.from_dict(stats)
    driver.get(url)
    WebDriverWait(driver, 30).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-updates"))
    text = lambda element_id: driver.execute_script(  # noqa: E731 - found and read in one step (see `lists`)
        "return document.getElementById(arguments[0]).innerText", element_id)
    assert text("hit-rate-value") == fmt_pct(snap.hit_tokens, snap.requested_tokens)
    # Lists are read in one script run: the page re-renders them on every poll, so elements found in one call may be
    # replaced before the next reads them (StaleElementReferenceException on a loaded machine).
    lists = driver.execute_script("""
        const q = (sel) => Array.from(document.querySelectorAll(sel));
        return {
          chips: q("#hit-rate-tiers .chip").map(c => [c.dataset.tier, c.innerText]),
          bars: q(".cap-bar").map(b => [b.dataset.node, b.dataset.tier, b.dataset.used, b.dataset.capacity]),
          rows: q("#namespaces .ns-row").map(r => [r.dataset.namespace, r.querySelector(".ns-hit-rate").innerText]),
        };""")
    chips = dict(lists["chips"])
    assert chips == {t: f"{t.upper()} {fmt_pct(snap.hit_tokens_by_tier.get(t, 0), snap.requested_tokens)}"
                     for t in snap.active_tiers()}
    assert text("requested-tokens") == f"{snap.requested_tokens:,}"
    assert text("seconds-saved") == fmt_seconds(snap.prefill_seconds_saved)
    assert text("pinned") == (f"pinned {snap.pinned_objects:,} objects ({fmt_bytes(snap.pinned_bytes)}) \u00b7 "
                              f"{snap.pins_clipped:,} clipped \u00b7 {snap.pinned_evictions:,} yielded")
    assert text("nodes-alive") == str(snap.nodes_alive)
    assert text("tombstones") == f"{snap.tombstones:,}" + (f" (+{snap.tombstones_folded:,} folded)"
                                                           if snap.tombstones_folded else "")
    assert text("records-refused") == f"{snap.records_refused:,}"
    assert driver.find_element(By.ID, "conn-status").get_attribute("data-state") == "live"
    bars = {(node, tier): (int(used), int(cap)) for node, tier, used, cap in lists["bars"]}
    assert bars == {(n, t): (u.bytes, u.capacity) for n, tiers in snap.nodes.items() for t, u in tiers.items()}
    rows = [tuple(r) for r in lists["rows"]]
    top = sorted(snap.namespaces.items(), key=lambda kv: (-kv[1].requested_tokens, kv[0]))[:10]
    assert rows == [(label, fmt_pct(c.hit_tokens, c.requested_tokens) if c.requested_tokens else "\u2014")
                    for label, c in top]
    return snap


def chart_series(driver, chart_id: str) -> set[str]:
    from selenium.webdriver.common.by import By

    return {p.get_attribute("data-series") for p in driver.find_elements(By.CSS_SELECTOR, f"#{chart_id} path.series")}


def save_full_page_screenshot(driver, *paths: Path) -> bytes:
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",  # whole page, not just the viewport
                           {"width": 1440, "height": height, "deviceScaleFactor": 1, "mobile": False})
    png = driver.get_screenshot_as_png()
    for out in paths:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(png)
    return png


@pytest.mark.browser
def test_dashboard_page_in_headless_chromium_shows_exact_hit_rate(tmp_path):
    driver, profile = _chrome_or_skip()
    clock = Clock(1_795_000_000.0)  # a fixed wall time, so the axis labels are real clock times
    # promote_on_hit=False: the master counts a promoted SSD hit as a DRAM hit, and this page should show both tiers
    pool = EmbeddedPool(dram_bytes=1 << 20, ssd_path=str(tmp_path / "ssd"), ssd_bytes=8 << 20, promote_on_hit=False)
    registry = CollectorRegistry()
    PoolMetrics.create(registry, pool.stats)
    server = DashboardServer(pool.stats, registry, sample_interval=None, clock=clock)
    try:
        server.start()
        server.sample()
        requested, hit = run_traffic(pool, server, clock, steps=90)
        # a connector's lookup reporting its prefill rate, and a pinned put: the "Prefill time saved" card
        ns = NAMESPACES[0]
        keys = block_keys(ns, prompt(0, 0))
        n = pool.lookup_prefix(keys, namespace=ns, prefill_s_per_token=0.0375)
        requested, hit = requested + len(keys) * ns.block_tokens, hit + n * ns.block_tokens
        pool.put_many(keys[:2], [b"p" * ns.block_bytes] * 2, namespace=ns, pin_s=600)
        # two objects put and removed: the "tombstones" of the movement card
        gone = [b"removed-%08d" % i for i in range(2)]
        assert pool.put_many(gone, [b"r" * 64] * 2) == ["stored"] * 2 and pool.remove_many(gone) == 2
        clock.t += 1
        server.sample()
        stats = pool.stats()
        assert stats["prefill_seconds_saved"] == n * ns.block_tokens * 0.0375 > 0 and stats["pinned_objects"] == 2
        assert (stats["tombstones"], stats["tombstones_folded"], stats["records_refused"]) == (2, 0, 0)
        snap = check_dashboard_page(driver, server.url, stats)
        # The master counted exactly what the clients saw, and the page showed it.
        assert (snap.requested_tokens, snap.hit_tokens) == (requested, hit)
        assert 0 < hit < requested and snap.hit_tokens_by_tier["dram"] > 0 and snap.hit_tokens_by_tier["ssd"] > 0
        assert snap.active_tiers() == ["dram", "ssd"]  # no HBM here: no HBM chip, line or bar
        assert {(n, t): (u.capacity) for n, tiers in snap.nodes.items() for t, u in tiers.items()} == {
            ("local", "dram"): 1 << 20, ("local", "ssd"): 8 << 20}
        assert list(snap.namespaces) and sorted(snap.namespaces, key=lambda k: -snap.namespaces[k].requested_tokens) \
            == ["smollm2-135m/default", "llama-3.2-1b/default", "smollm2-135m/team-b"]
        assert chart_series(driver, "hit-rate-chart") == {"all", "dram", "ssd"}
        assert chart_series(driver, "throughput-chart") == {"requested", "hit"}
        # artifacts/ (gitignored) every run; the README's docs/dashboard.png only on request or when missing,
        # because Chromium's text antialiasing differs by a few pixels between runs and a committed PNG that
        # changes on every test run would end up in other people's commits.
        docs_png = ROOT / "docs" / "dashboard.png"
        update_docs = os.environ.get("KVPOOL_UPDATE_SCREENSHOT") == "1" or not docs_png.exists()
        outs = [ROOT / "artifacts" / "dashboard.png"] + ([docs_png] if update_docs else [])
        png = save_full_page_screenshot(driver, *outs)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        driver.quit()
        server.stop()
        pool.close()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.browser
def test_dashboard_page_shows_empty_pool_then_outage_then_recovery():
    driver, profile = _chrome_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    counters = Counters()
    counters.stats["nodes"] = {}
    server = DashboardServer(counters, CollectorRegistry(), sample_interval=None)
    state = lambda d: d.find_element(By.ID, "conn-status").get_attribute("data-state")  # noqa: E731
    try:
        server.start()
        driver.get(server.url)
        WebDriverWait(driver, 30).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-updates"))
        assert driver.find_element(By.ID, "hit-rate-value").text == "\u2014"  # 0 of 0 tokens is not 0%
        assert driver.find_element(By.ID, "hit-rate-detail").text == "no tokens requested yet"
        assert driver.find_element(By.ID, "capacity").text == "no storage nodes registered"
        assert driver.find_element(By.CSS_SELECTOR, "#namespaces .ns-row").get_attribute("data-namespace") == \
            "m/default"
        assert driver.find_element(By.CSS_SELECTOR, "#namespaces .ns-hit-rate").text == "\u2014"
        counters.fail = True
        WebDriverWait(driver, 30).until(lambda d: state(d) == "down")
        assert driver.find_element(By.ID, "conn-status").text == "pool unreachable"
        counters.fail = False
        counters.stats["nodes"] = {"n1": {"dram": {"objects": 1, "bytes": 512, "capacity": 1024}}}
        counters.traffic(requested=32, dram=8, ssd=0)
        WebDriverWait(driver, 30).until(lambda d: state(d) == "live")
        WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "hit-rate-value").text == "25.0%")
        bar = driver.find_element(By.CSS_SELECTOR, ".cap-bar")
        assert (bar.get_attribute("data-node"), bar.get_attribute("data-tier"), bar.get_attribute("data-used"),
                bar.get_attribute("data-capacity")) == ("n1", "dram", "512", "1024")
    finally:
        driver.quit()
        server.stop()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.browser
def test_dashboard_of_kvpool_up_matches_kvpool_status_json(tmp_path):
    """The issue's end-to-end check: a real `kvpool up` process, traffic from a PoolClient in this process, then the
    page in headless Chromium shows exactly the hit rate of `kvpool status --json` (and of the clients' own count)."""
    import dataclasses
    import subprocess
    import sys

    from kvpool import PoolClient
    from kvpool.store.config import UpConfig
    from tests.store.cluster import free_port, wait_serving

    if "http_listen" not in {f.name for f in dataclasses.fields(UpConfig)}:
        pytest.skip("kvpool up does not serve the dashboard yet (UpConfig.http_listen)")
    driver, profile = _chrome_or_skip()
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    address, http_port = f"127.0.0.1:{free_port()}", free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kvpool.cli", "up", "--listen", address, "--dram-bytes", "1MiB",
                             "--ssd-path", str(tmp_path / "ssd"), "--ssd-bytes", "8MiB", "--shm-dir", shm,
                             "--http-listen", f"127.0.0.1:{http_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_serving(address, proc=proc)
        requested = hit = 0
        with PoolClient(address, timeout=10) as client:
            for step in range(12):
                for i, ns in enumerate(NAMESPACES):
                    keys = block_keys(ns, prompt(i, step))
                    n = client.get_many_into(keys, [bytearray(ns.block_bytes) for _ in keys], namespace=ns)
                    requested += len(keys) * ns.block_tokens
                    hit += n * ns.block_tokens
                    client.put_many(keys[n:], [bytes([step]) * ns.block_bytes] * (len(keys) - n), namespace=ns)
        status = subprocess.run([sys.executable, "-m", "kvpool.cli", "status", "--json", "--master", address],
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        stats = json.loads(status.stdout)
        url = f"http://127.0.0.1:{http_port}/"
        pause = threading.Event()
        for _ in range(100):  # bounded: let the up process sample twice, so the charts have lines in the artifact
            if len(json.loads(get(url + "api/history")[2])["points"]) >= 2:
                break
            pause.wait(0.1)
        snap = check_dashboard_page(driver, url, stats)
        assert (snap.requested_tokens, snap.hit_tokens) == (requested, hit) and 0 < hit < requested
        save_full_page_screenshot(driver, ROOT / "artifacts" / "dashboard-kvpool-up.png")
    finally:
        driver.quit()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(profile, ignore_errors=True)
