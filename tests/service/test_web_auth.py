"""The web view of a service that knows its users: log in, and who may cancel whose query.

A ``flight-coordinator`` with a users file (alice, bob, carol) and a token file (ci), ``--operators carol``
and ``--http-port 0``, over the session's workers. The API answers nobody who has not logged in; a login
by password or token gives a session cookie (HttpOnly, SameSite=Strict); alice's running query may be
cancelled by alice or carol, not by bob, on the page as by Flight SQL's ``CancelFlightInfo``. In a real
headless Chromium the page shows a login form, and after it the Cancel button of alice's query only to
those who may press it.
"""

from __future__ import annotations

import http.cookiejar
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.flight as fl
import pytest
from support import running_tasks, tpch_test_files, wait_until

import flight
from benchmarks.tpch_sql import SQL
from flight.service.commands import pack
from flight.wire._proto import Flight_pb2
from flight.wire._proto import FlightSql_pb2 as sql_pb2
from tests.service.test_web import CHROMIUM, DRIVER

PASSWORDS = {"alice": "alice pass 1", "bob": "bob pass 2", "carol": "carol pass 3"}
TOKEN = "ci-token-5d1e"


@pytest.fixture(scope="module")
def service(cluster: flight.LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    where = tmp_path_factory.mktemp("users")
    lines = []
    for name, password in PASSWORDS.items():
        made = subprocess.run([sys.executable, "-m", "flight.service", "hash-password"], input=password + "\n",
                              capture_output=True, text=True, timeout=60, check=True)
        lines.append(f"{name}:{made.stdout.strip()}")
    (where / "users").write_text("\n".join(lines) + "\n")
    (where / "tokens").write_text(f"ci:{TOKEN}\n")
    files = tpch_test_files(0.1)
    tables = [a for t in ("lineitem", "orders", "customer") for a in ("--table", f"{t}={files[t][0].parent}")]
    proc = subprocess.Popen([sys.executable, "-m", "flight.service", "--port", "0", "--http-port", "0", "--grace", "5",
                             "--workers", ",".join(cluster.urls), "--users-file", str(where / "users"),
                             "--auth-token-file", str(where / "tokens"), "--operators", "carol", *tables],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    flight_url, page = proc.stdout.readline().split()[-1], proc.stdout.readline().split()[-1]
    try:
        yield flight_url, page
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        proc.stdout.close()


class Browser:
    """An HTTP client with a cookie jar, as a browser keeps the session cookie."""

    def __init__(self, page: str) -> None:
        self.page = page
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def call(self, path: str, body: dict[str, str] | None = None, method: str | None = None) -> tuple[int, dict]:  # type: ignore[type-arg]
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.page + path, data=data, method=method or ("POST" if data else "GET"))
        try:
            with self.opener.open(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


def _start_as(flight_url: str, user: str) -> fl.FlightInfo:
    """A statement of ``user``'s, started and left unread (it stays running)."""
    client = fl.connect(flight_url)
    headers = client.authenticate_basic_token(user, PASSWORDS[user])
    info = client.get_flight_info(fl.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=SQL[3]))),
                                  fl.FlightCallOptions(headers=[headers]))
    client.close()
    return info


def _running(browser: Browser) -> list[dict]:  # type: ignore[type-arg]
    status, data = browser.call("api/queries")
    assert status == 200
    return list(data["running"])


def test_the_api_wants_a_login_and_a_wrong_one_learns_nothing(service: tuple[str, str]) -> None:
    _, page = service
    nobody = Browser(page)
    for path in ("api/queries", "api/workers", "api/me"):
        assert nobody.call(path)[0] == 401
    assert nobody.call("api/queries/x/cancel", method="POST")[0] == 401
    for body in ({"user": "alice", "password": "wrong"}, {"user": "mallory", "password": "x"}, {"token": "nope"}, {"user": "alice"}):
        status, answer = nobody.call("api/login", body)
        assert status == 401 and answer == {"error": "wrong user, password or token"}
        assert not list(nobody.jar)
    status, me = nobody.call("api/login", {"token": TOKEN})
    assert status == 200 and me == {"user": "ci", "operator": False, "login": True}
    (cookie,) = list(nobody.jar)
    assert cookie.name == "flight_session" and TOKEN not in cookie.value  # a session token, never the static one
    assert cookie.has_nonstandard_attr("HttpOnly") and cookie.get_nonstandard_attr("SameSite", "").lower() == "strict"
    assert nobody.call("api/workers")[0] == 200
    assert nobody.call("api/logout", method="POST")[0] == 200 and nobody.call("api/me")[0] == 401


def test_a_query_is_cancelled_by_its_user_or_an_operator_alone(service: tuple[str, str], cluster: flight.LocalCluster) -> None:
    flight_url, page = service
    people = {}
    for name in PASSWORDS:
        people[name] = Browser(page)
        status, me = people[name].call("api/login", {"user": name, "password": PASSWORDS[name]})
        assert status == 200 and me["operator"] == (name == "carol")
    for canceller in ("alice", "carol"):
        info = _start_as(flight_url, "alice")
        wait_until(lambda: len(_running(people["bob"])) == 1, 15.0, "alice's query to run")
        (query,) = _running(people["bob"])
        assert query["user"] == "alice"
        status, answer = people["bob"].call(f"api/queries/{query['id']}/cancel", method="POST")
        assert status == 403 and answer == {"cancelled": False, "error": "only its user (alice) or an operator may cancel it"}
        # Flight SQL's cancel by bob, who holds the FlightInfo, is refused the same way.
        assert _cancel_flight_info(flight_url, "bob", info) == Flight_pb2.CANCEL_STATUS_NOT_CANCELLABLE
        assert len(_running(people["bob"])) == 1
        status, answer = people[canceller].call(f"api/queries/{query['id']}/cancel", method="POST")
        assert status == 200 and answer == {"cancelled": True}
        wait_until(lambda: running_tasks(cluster.urls) == 0, 15.0, "the workers to end the cancelled query's tasks")
        wait_until(lambda: not _running(people["bob"]), 10.0, "the query to end")


def _cancel_flight_info(flight_url: str, user: str, info: fl.FlightInfo) -> int:
    client = fl.connect(flight_url)
    headers = client.authenticate_basic_token(user, PASSWORDS[user])
    request = Flight_pb2.CancelFlightInfoRequest()
    request.info.ParseFromString(info.serialize())
    (result,) = list(client.do_action(fl.Action("CancelFlightInfo", request.SerializeToString()), fl.FlightCallOptions(headers=[headers])))
    client.close()
    answer = Flight_pb2.CancelFlightInfoResult()
    answer.ParseFromString(result.body.to_pybytes())
    return int(answer.status)


@pytest.mark.required
@pytest.mark.skipif(CHROMIUM is None or DRIVER is None, reason="needs Debian's chromium and chromium-driver (the README's test command installs them)")
def test_the_page_logs_in_and_shows_cancel_only_to_who_may(service: tuple[str, str], cluster: flight.LocalCluster, tmp_path: Path) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.service.test_web import chromium_driver

    flight_url, page = service
    _start_as(flight_url, "alice")
    watcher = Browser(page)
    watcher.call("api/login", {"user": "carol", "password": PASSWORDS["carol"]})
    wait_until(lambda: len(_running(watcher)) == 1, 15.0, "alice's query to run")
    (query,) = _running(watcher)
    button = f"button.cancel[data-query='{query['id']}']"
    for name, sees_cancel in (("bob", False), ("alice", True)):
        driver = chromium_driver()
        try:
            wait = WebDriverWait(driver, 20, ignored_exceptions=(StaleElementReferenceException,))
            driver.get(page)
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "form.login"))
            driver.find_element(By.NAME, "user").send_keys(name)
            driver.find_element(By.NAME, "password").send_keys(PASSWORDS[name])
            driver.find_element(By.CSS_SELECTOR, "form.login button").click()
            wait.until(lambda d, who=name: d.find_element(By.ID, "whoami").text.startswith(who))
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"tr[data-query='{query['id']}']"))
            assert bool(driver.find_elements(By.CSS_SELECTOR, button)) == sees_cancel
            if sees_cancel:
                wait.until(lambda d: d.find_element(By.CSS_SELECTOR, button).click() or True)
                wait_until(lambda: running_tasks(cluster.urls) == 0, 15.0, "the workers to end alice's cancelled query")
        finally:
            driver.quit()


def test_a_hostile_login_is_refused_before_it_is_held(service: tuple[str, str]) -> None:
    _, page = service
    nobody = Browser(page)
    status, answer = nobody.call("api/login", {"user": "alice", "password": "x" * 100_000})
    assert status == 413 and answer == {"error": "a login is at most 4096 bytes"}
    for body in (b"[1, 2]", b"not json", b'{"user": 1, "password": ["x"]}', b"\xff\xfe", b"[" * 3000 + b"]" * 3000):
        request = urllib.request.Request(page + "api/login", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            nobody.opener.open(request, timeout=10)
        assert refused.value.code in (401, 413)
        refused.value.close()
    assert nobody.call("api/queries")[0] == 401
