"""The service's live view: the JSON API and ``/metrics`` over HTTP, and the page in a real headless Chromium.

The service runs as a subprocess with ``--http-port 0`` over the session's two workers. A query is
started through Flight SQL and left unread, so it stays running: the queries page lists it, its page
shows the stage graph with each stage's tasks done, and its Cancel button ends it (the workers are
back to no task). A screenshot of the query's page is kept under ``.ci/artifacts/`` (ignored by
git). ``/metrics`` is read with ``prometheus-client``'s own parser.

The browser is Debian's ``chromium`` driven by Selenium through Debian's ``chromedriver``; the
README's test command installs both. Without them the browser test is skipped, saying so.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.flight as fl
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import running_tasks, tpch_test_files, wait_until

import flight
from benchmarks.tpch_queries import duckdb_connection
from benchmarks.tpch_sql import SQL
from flight.service.commands import pack
from flight.wire._proto import FlightSql_pb2 as sql_pb2

ARTIFACTS = Path(__file__).resolve().parents[2] / ".ci" / "artifacts"


@pytest.fixture(scope="module")
def service(cluster: flight.LocalCluster) -> Iterator[tuple[str, str]]:
    """(Flight SQL URL, page URL) of a service with a web view."""
    tables = [a for t in ("lineitem", "orders", "customer", "supplier", "nation", "region") for a in ("--table", f"{t}={tpch_test_files(0.1)[t][0].parent}")]
    proc = subprocess.Popen([sys.executable, "-m", "flight.service", "--port", "0", "--http-port", "0", "--grace", "5", "--workers",
                             ",".join(cluster.urls), *tables], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    flight_url = proc.stdout.readline().split()[-1]
    page = proc.stdout.readline().split()[-1]
    assert page.startswith("http://")
    try:
        yield flight_url, page
    finally:
        proc.terminate()
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(10)
        proc.stdout.close()
        assert code == 0, f"the service exited {code} on SIGTERM"


@pytest.fixture(scope="module")
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb_connection(tpch_test_files(0.1))
    yield c
    c.close()


def get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - the test's own service on loopback
        return json.loads(response.read())


def start_unread(flight_url: str, text: str) -> str:
    """Start ``text`` through Flight SQL without reading it: it stays running. Its query id."""
    client = fl.connect(flight_url)
    client.get_flight_info(fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=text))))
    client.close()
    return ""


def _detail(page: str, query_id: str) -> dict:  # type: ignore[type-arg]
    data = get(f"{page}api/queries/{query_id}")
    assert isinstance(data, dict)
    return data


def running_ids(page: str) -> list[str]:
    data = get(page + "api/queries")
    assert isinstance(data, dict)
    return [q["id"] for q in data["running"]]


def test_the_api_shows_a_running_query_with_its_stages_and_cancels_it(service: tuple[str, str], cluster: flight.LocalCluster) -> None:
    flight_url, page = service
    start_unread(flight_url, SQL[3])
    wait_until(lambda: len(running_ids(page)) == 1, 10.0, "the query to be listed as running")
    (query_id,) = running_ids(page)
    detail = get(f"{page}api/queries/{query_id}")
    assert isinstance(detail, dict) and detail["state"] == "running" and detail["sql"] == SQL[3] and detail["user"] == "anonymous"
    assert len(detail["stages"]) >= 2 and detail["stages"][-1]["consumers"] == []
    # Its rows wait unread, so every task finishes: then each stage's time line is closed, from its
    # first task's open to its last task's output, and every unit its feeds found was sent and taken.
    wait_until(lambda: all(s["end"] is not None for s in _detail(page, query_id)["stages"]), 30.0, "every stage to finish")
    detail = _detail(page, query_id)
    for stage in detail["stages"]:
        assert 0 <= stage["start"] <= stage["end"], stage
        for task in stage["tasks"]:
            assert task["opened"] <= task["ready"] <= task["finished"] <= stage["end"] and task["spilled"] == 0, task
    children = {c for s in detail["stages"] for c in s["consumers"]}
    assert all(s["start"] <= detail["stages"][-1]["end"] for s in detail["stages"]) and children
    assert detail["feeds"], "tables given as directories are listed as the query runs: a feed each"
    for feed in detail["feeds"]:
        assert feed["discovery_ended"] and feed["discovered"] == feed["sent"] == feed["taken"] > 0 and feed["waiting"] == 0, feed
    request = urllib.request.Request(f"{page}api/queries/{query_id}/cancel", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
        assert json.loads(response.read()) == {"cancelled": True}
    wait_until(lambda: running_tasks(cluster.urls) == 0, 15.0, "the workers to free the cancelled query's tasks")
    ended = get(page + "api/queries")
    assert isinstance(ended, dict) and ended["ended"][0]["id"] == query_id and ended["ended"][0]["state"] == "cancelled"
    workers = get(page + "api/workers")
    assert isinstance(workers, dict) and [w["url"] for w in workers["workers"]] == cluster.urls


def test_metrics_parse_with_prometheus_clients_own_parser(service: tuple[str, str]) -> None:
    flight_url, page = service
    with fl.connect(flight_url) as client:
        info = client.get_flight_info(fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query="select 1 as one"))))
        for endpoint in info.endpoints:
            fl.connect(endpoint.locations[0]).do_get(endpoint.ticket).read_all()
    with urllib.request.urlopen(page + "metrics", timeout=10) as response:  # noqa: S310 - loopback
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    assert {"flight_queries_ended", "flight_queries_running", "flight_query_seconds", "flight_result_rows"} <= set(families)
    wait_until(lambda: _ended_finished(page) >= 1, 10.0, "a finished query to be counted")


def _ended_finished(page: str) -> float:
    with urllib.request.urlopen(page + "metrics", timeout=10) as response:  # noqa: S310 - loopback
        for family in text_string_to_metric_families(response.read().decode()):
            if family.name == "flight_queries_ended":
                return sum(s.value for s in family.samples if s.labels.get("state") == "finished" and s.name.endswith("_total"))
    return 0.0


CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.mark.required
@pytest.mark.skipif(CHROMIUM is None or DRIVER is None, reason="needs Debian's chromium and chromium-driver (the README's test command installs them)")
def test_the_page_in_a_real_browser_shows_the_stages_and_cancels(service: tuple[str, str], cluster: flight.LocalCluster) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    flight_url, page = service
    driver = chromium_driver()
    try:
        start_unread(flight_url, SQL[5])
        wait_until(lambda: len(running_ids(page)) == 1, 10.0, "the query to be listed as running")
        (query_id,) = running_ids(page)
        # The page draws itself again every second: an element found may be gone a moment later,
        # so every look at it is retried until it holds.
        wait = WebDriverWait(driver, 20, ignored_exceptions=(StaleElementReferenceException,))
        driver.get(page)
        wait.until(lambda d: any(a.text == query_id for a in d.find_elements(By.CSS_SELECTOR, "tr[data-query] a")))
        driver.get(f"{page}#/query/{query_id}")
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "svg.stage-graph g.node")) >= 2)
        # The tasks finish (their rows wait unread on the workers): every stage's node counts all its tasks done.
        wait.until(lambda d: (nodes := d.find_elements(By.CSS_SELECTOR, "svg.stage-graph g.node"))
                   and all(n.get_attribute("data-tasks-done") == n.get_attribute("data-tasks") != "0" for n in nodes))
        # The time line has a row per stage, and the feeds table a row per table listed as the query ran.
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-timeline] .track .span"))
                   == len(d.find_elements(By.CSS_SELECTOR, "svg.stage-graph g.node")))
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-feed]")) >= 1)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "service-query-page.png"))
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f"button.cancel[data-query='{query_id}']").click() or True)
        wait.until(lambda d: any(c.text == "cancelled" for c in d.find_elements(By.CSS_SELECTOR, "td.state-cancelled")))
        wait_until(lambda: running_tasks(cluster.urls) == 0, 15.0, "the workers to free the cancelled query's tasks")
    finally:
        driver.quit()


def chromium_driver():  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1800"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=str(DRIVER)), options=options)


GRAPH = """
const texts = g => [...g.querySelectorAll('text')].map(t => t.textContent).join('\\n');
return {
  nodes: [...document.querySelectorAll('svg.stage-graph g.node')].map(n => ({stage: n.dataset.stage, rows: n.dataset.rows, text: texts(n)})),
  edges: [...document.querySelectorAll('svg.stage-graph g.edge')].map(e => ({from: e.dataset.from, kind: e.dataset.kind, text: texts(e)})),
  legend: document.querySelector('p.legend').textContent,
};
"""


def explain_numbers(text: str) -> dict[int, dict[str, int | None]]:
    """Per stage of an ``explain(analyze=True)``: the rows its tasks sent, and the planner's estimate."""
    stages: dict[int, dict[str, int | None]] = {}
    current = None
    for line in text.splitlines():
        if (m := re.match(r"Stage (\d+) \[", line)) is not None:
            current = int(m.group(1))
            stages[current] = {"rows": 0, "estimated": None}
        elif current is not None and (m := re.search(r"\| rows in \d+, out (\d+);", line)) is not None:
            stages[current]["rows"] = int(stages[current]["rows"] or 0) + int(m.group(1))
        elif current is not None and (m := re.match(r"  output: estimated ~([\d,]+) rows", line)) is not None:
            stages[current]["estimated"] = int(m.group(1).replace(",", ""))
    return stages


def run_to_the_end(flight_url: str, text: str) -> int:
    """Run ``text`` through Flight SQL and read all its rows (the query finishes); how many."""
    with fl.connect(flight_url) as client:
        info = client.get_flight_info(fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=text))))
    rows = 0
    for endpoint in info.endpoints:
        with fl.connect(endpoint.locations[0]) as reader:
            rows += reader.do_get(endpoint.ticket).read_all().num_rows
    return rows


@pytest.mark.required
@pytest.mark.skipif(CHROMIUM is None or DRIVER is None, reason="needs Debian's chromium and chromium-driver (the README's test command installs them)")
def test_a_finished_querys_graph_shows_explains_numbers_and_the_list_one_line_a_query(
    service: tuple[str, str], con: duckdb.DuckDBPyConnection
) -> None:
    """The stage graph of a finished query: a node per stage whose rows, tasks and estimate are ``explain()``'s
    after the run, an edge per exchange with its kind; the list shows the SQL's first line, expands it on a
    click, and filters by state. Screenshots of both pages go to ``.ci/artifacts/``."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    flight_url, page = service
    text = "-- orders per segment and priority\n" + SQL[3]
    got = run_to_the_end(flight_url, text)
    assert got == len(con.sql(SQL[3]).fetchall())
    wait_until(lambda: any(q["sql"] == text and q["state"] == "finished" for q in _ended(page)), 15.0, "the query to finish")
    query = next(q for q in _ended(page) if q["sql"] == text)
    first = next(line.strip() for line in SQL[3].splitlines() if line.strip())
    assert query["first_line"] == first and query["rows"] == got  # the first line that is not a comment
    detail = _detail(page, query["id"])
    explained = get(f"{page}api/queries/{query['id']}/explain")
    assert isinstance(explained, dict) and explained["analyzed"]
    numbers = explain_numbers(explained["text"])
    assert set(numbers) == {s["id"] for s in detail["stages"]}
    driver = chromium_driver()
    try:
        wait = WebDriverWait(driver, 20, ignored_exceptions=(StaleElementReferenceException,))
        driver.get(f"{page}#/query/{query['id']}")
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "svg.stage-graph g.node")) == len(numbers))
        # Read in one script, between two of the page's redraws (an element found may be gone a second later).
        graph = driver.execute_script(GRAPH)
        nodes = {int(n["stage"]): n for n in graph["nodes"]}
        for stage_id, want in numbers.items():
            node = nodes[stage_id]
            assert int(node["rows"]) == want["rows"], (stage_id, want)
            assert f"{want['rows']:,} rows" in node["text"]
            if want["estimated"] is not None:
                assert f"est ~{want['estimated']:,}" in node["text"]
        edges = graph["edges"]
        assert len(edges) == sum(len(s["consumers"]) for s in detail["stages"])
        assert {(int(e["from"]), e["kind"]) for e in edges} == {(s["id"], s["output"]) for s in detail["stages"] if s["consumers"]}
        assert all(e["text"].startswith(e["kind"] + " · ") for e in edges)
        assert all(f"{w['label']} = {w['url']}" in graph["legend"] for w in detail["workers"])
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "service-stage-graph.png"))
        driver.get(page)
        cell = f"tr[data-query='{query['id']}'] td.sql-line"
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, cell).text == "▸ " + first)
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, cell).click() or True)
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f"tr[data-sql-of='{query['id']}'] pre.sql").text == text.strip())
        driver.save_screenshot(str(ARTIFACTS / "service-query-list.png"))
        states = "return [...document.querySelectorAll('table.queries tr[data-query] td:nth-child(2)')].map(c => c.textContent)"
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "select[data-filter='state'] option[value='running']").click() or True)
        wait.until(lambda d: not d.execute_script(states))  # nothing runs now
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "select[data-filter='state'] option[value='finished']").click() or True)
        wait.until(lambda d: (shown := d.execute_script(states)) and set(shown) == {"finished"})
        assert driver.find_elements(By.CSS_SELECTOR, f"tr[data-query='{query['id']}']")
    finally:
        driver.quit()


def _ended(page: str) -> list[dict]:  # type: ignore[type-arg]
    data = get(page + "api/queries")
    assert isinstance(data, dict)
    return list(data["ended"])
