"""The epochs console in a real browser: headless Chromium against Airflow 3's API server on the local stack.

One Airflow API server (its own home, a free port, the simple auth manager with an admin and a viewer)
serves the plugin for the whole module. The pipeline's epochs are real: epoch 1 read Kafka and committed
Parquet files with the local executor (one record was undecodable: a dead letter); a test that needs an
undecided epoch plans one (`undecided`), so no test depends on what another did before it. The browser
logs in through Airflow's login page, reads the console, aborts the undecided epoch, is refused the abort
of epoch 1 in the coordinator's words, and a viewer is refused any action on the undecided one. Screenshots
are saved as console-*.png in the test's temporary folder, or, with ONCEFLOW_CONSOLE_SCREENSHOTS=docs
(a folder, relative to the checkout), where docs/operations.md shows them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from local_stack.local_airflow import stop_process_groups
from local_stack.ports import free_port

from onceflow.config import Settings
from onceflow.ledger import EpochStatus, Ledger
from onceflow.ledger.refusals import abort_refusal
from onceflow.protocol.coordinator import Coordinator
from tests.integration.engine.data import produce

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
SPEC = "tests.integration.airflow.console_pipeline:CONSOLE"
CHROMEDRIVER = "/usr/bin/chromedriver"
PASSWORDS = {"admin": "console-admin-pw", "viewer": "console-viewer-pw"}
DAG_FILE = 'from onceflow_airflow.dag_factory import build_dag\n\ndag = build_dag("{spec}")\n'


@dataclass
class Console:
    url: str  # the Airflow API server, e.g. http://127.0.0.1:PORT
    pipeline: str
    dag_id: str
    topic: str
    ledger_url: str
    run_id: str  # the run of epoch 1 (committed)


def wait_healthy(url: str, server: subprocess.Popen[bytes], log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the API server exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the API server did not answer within {timeout}s:\n{log.read_text()[-3000:]}")


def plant_epochs(env: dict[str, str], settings: Settings, run_id: str) -> None:
    """Epoch 1 committed through the local executor (with a dead letter), and three records after it
    for an undecided epoch to read."""
    from onceflow.engine.runner import run_epoch

    topic = env["ONCEFLOW_CONSOLE_TOPIC"]
    produce(settings.kafka_bootstrap, topic, [{"id": i, "page": f"/p{i}"} for i in range(12)], bad=[b"{oops"])
    outcome = run_epoch(SPEC, Settings.from_env(), executor="local", run_id=run_id)
    assert outcome.epoch.status is EpochStatus.COMMITTED
    produce(settings.kafka_bootstrap, topic, [{"id": i, "page": "/later"} for i in range(12, 15)])


@pytest.fixture(scope="module")
def console(
    tmp_path_factory: pytest.TempPathFactory, settings: Settings, kafka_admin: Any
) -> Iterator[Console]:
    from confluent_kafka.admin import NewTopic
    from local_stack.local_airflow import airflow_environment, migrate, run_airflow

    tmp = tmp_path_factory.mktemp("console")
    suffix = uuid.uuid4().hex[:8]
    pipeline, topic = f"console-{suffix}", f"console-{suffix}"
    kafka_admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    ours = {
        "ONCEFLOW_CONSOLE_PIPELINE": pipeline,
        "ONCEFLOW_CONSOLE_TOPIC": topic,
        "ONCEFLOW_CONSOLE_FILES": str(tmp / "files"),
        "ONCEFLOW_HOME": str(tmp / "onceflow-home"),
        "ONCEFLOW_LEDGER_URL": f"sqlite:///{tmp / 'ledger.db'}",
        "ONCEFLOW_PIPELINES": SPEC,
    }
    run_id = f"manual__console-{suffix}-1"
    server = None
    with pytest.MonkeyPatch.context() as patch:
        for key, value in ours.items():
            patch.setenv(key, value)
        patch.delitem(sys.modules, "tests.integration.airflow.console_pipeline", raising=False)
        try:
            with Ledger.connect(ours["ONCEFLOW_LEDGER_URL"], check=False) as ledger:
                ledger.upgrade()
            plant_epochs(ours, settings, run_id)

            home = tmp / "airflow-home"
            dags = tmp / "dags"
            dags.mkdir()
            (dags / "onceflow_console_test.py").write_text(DAG_FILE.format(spec=SPEC))
            port = free_port()
            passwords = home / "passwords.json"
            env = airflow_environment(settings, ROOT, home, {**os.environ, **ours})
            env.update(ours)  # over the session's settings, which airflow_environment passes on
            env.update(
                {
                    "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
                    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
                    "AIRFLOW__API__PORT": str(port),
                    "AIRFLOW__API__HOST": "127.0.0.1",
                    "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
                    "AIRFLOW__API__WORKERS": "1",
                    "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
                }
            )
            migrate(env)
            passwords.write_text(json.dumps(PASSWORDS))
            dag_id = f"onceflow_{pipeline}"
            # The DAG and its run of epoch 1, so that the run's page has the "Epoch" tab to show.
            run_airflow(["dags", "reserialize"], env, timeout=300)
            run_airflow(["dags", "trigger", dag_id, "--run-id", run_id], env, timeout=300)
            log = tmp / "api-server.log"
            with log.open("wb") as out:
                server = subprocess.Popen(
                    [str(Path(sys.executable).parent / "airflow"), "api-server", "--port", str(port)],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, server, log)
            yield Console(url, pipeline, dag_id, topic, ours["ONCEFLOW_LEDGER_URL"], run_id)
        finally:
            if server is not None and server.poll() is None:
                stop_process_groups([server])
            kafka_admin.delete_topics([topic])
            shutil.rmtree(tmp / "files", ignore_errors=True)


@pytest.fixture
def undecided(console: Console) -> int:
    """The number of an epoch in flight, PLANNED and undecided (what an action can still change): the
    one an earlier test left, or one planned now."""
    from onceflow.pipeline import load_pipeline

    with Ledger.connect(console.ledger_url) as ledger:
        open_epoch = ledger.open_epoch(console.pipeline)
        if open_epoch is not None:
            assert open_epoch.status is EpochStatus.PLANNED, open_epoch
            return open_epoch.number
        coordinator = Coordinator.for_pipeline(load_pipeline(SPEC), ledger, Settings.from_env())
        planned = coordinator.plan(run_id=f"manual__{console.pipeline}-{uuid.uuid4().hex[:6]}")
    assert planned.status == "planned" and planned.epoch is not None, planned
    return planned.epoch


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: ONCEFLOW_CONSOLE_SCREENSHOTS (e.g. docs), else a temporary folder."""
    wanted = os.environ.get("ONCEFLOW_CONSOLE_SCREENSHOTS")
    folder = ROOT / wanted if wanted else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser_factory() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not Path(CHROMEDRIVER).is_file():
        pytest.fail(
            f"{CHROMEDRIVER} is missing: install Debian's chromium and chromium-driver "
            "(`apt-get install -y chromium chromium-driver`, as .ci/run does)",
            pytrace=False,
        )
    drivers = []

    def make() -> webdriver.Chrome:
        options = webdriver.ChromeOptions()
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,1100"):
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        driver.implicitly_wait(0)
        drivers.append(driver)
        return driver

    yield make
    for driver in drivers:
        driver.quit()


def wait_for(driver: Any, condition: Any, timeout: float = 30) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def log_in(driver: Any, console: Console, user: str, path: str) -> None:
    """Open ``path``: the console sends the browser to Airflow's login page, which comes back to it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    driver.get(f"{console.url}{path}")
    wait_for(driver, ec.presence_of_element_located((By.NAME, "username")))
    assert "/auth/login" in driver.current_url
    driver.find_element(By.NAME, "username").send_keys(user)
    driver.find_element(By.NAME, "password").send_keys(PASSWORDS[user])
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def console_page(driver: Any, console: Console, user: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    log_in(driver, console, user, f"/onceflow/?pipeline={console.pipeline}")
    wait_for(
        driver, ec.text_to_be_present_in_element((By.CSS_SELECTOR, "h2 .pipeline-name"), console.pipeline)
    )


def run_action(driver: Any, action: str, epoch: int) -> str:
    """Fill the action form, confirm, and return the answer the page shows."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select

    form = driver.find_element(By.ID, "action-form")
    banner = driver.find_element(By.ID, "action-result")
    before = banner.text if banner.is_displayed() else None  # the answer of an earlier action, if shown
    Select(form.find_element(By.NAME, "action")).select_by_visible_text(action)
    field = form.find_element(By.NAME, "epoch")
    field.clear()
    field.send_keys(str(epoch))
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(driver, ec.alert_is_present()).accept()

    def answered(d: Any) -> str | None:
        shown = d.find_element(By.ID, "action-result")
        return shown.text if shown.is_displayed() and shown.text != before else None

    return str(wait_for(driver, answered))


def post_from_page(
    driver: Any, path: str, content_type: str = "application/json", epoch: int = 1
) -> tuple[int, str]:
    """POST ``{"epoch": epoch}`` from the signed-in page (its cookie, its origin): status and body."""
    status, body = driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        fetch(arguments[0], {method: "POST", credentials: "same-origin",
                             headers: {"Content-Type": arguments[1]},
                             body: JSON.stringify({epoch: arguments[2]})})
          .then(async (r) => done([r.status, await r.text()]));
        """,
        path,
        content_type,
        epoch,
    )
    return int(status), str(body)


def status_of(console: Console, epoch: int) -> EpochStatus:
    with Ledger.connect(console.ledger_url) as ledger:
        return ledger.epoch(console.pipeline, epoch).status


def test_an_unauthenticated_request_is_refused(console: Console, undecided: int) -> None:
    for method, path in (
        ("GET", "/onceflow/api/pipelines"),
        ("GET", f"/onceflow/api/pipelines/{console.pipeline}"),
        ("POST", f"/onceflow/api/pipelines/{console.pipeline}/actions/abort"),
    ):
        request = urllib.request.Request(
            console.url + path,
            method=method,
            data=json.dumps({"epoch": undecided}).encode() if method == "POST" else None,
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 401, path
    assert status_of(console, undecided) is EpochStatus.PLANNED

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object) -> None:
            return None

    with pytest.raises(urllib.error.HTTPError) as sent:
        urllib.request.build_opener(NoRedirect).open(f"{console.url}/onceflow/", timeout=30)
    assert sent.value.code == 303 and "/auth/login" in sent.value.headers["location"]


def test_the_console_shows_the_committed_epoch_its_ranges_and_the_dead_letter(
    console: Console, undecided: int, browser_factory: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser_factory()
    console_page(driver, console, "admin")
    with Ledger.connect(console.ledger_url) as ledger:
        first = ledger.epoch(console.pipeline, 1)
        planned = ledger.epoch(console.pipeline, undecided)
        numbers = [str(e.number) for e in ledger.epochs(console.pipeline)]
    rows = {
        row.find_element(By.CSS_SELECTOR, ".epoch-number").text: row
        for row in driver.find_elements(By.CSS_SELECTOR, "table.epochs tbody tr")
    }
    assert sorted(rows, key=int) == sorted(numbers, key=int)
    committed = rows["1"].text
    assert "COMMITTED" in committed and console.run_id in committed
    shown = [li.text for li in rows["1"].find_elements(By.CSS_SELECTOR, "li.range")]
    assert shown == [f"{r.topic}[{r.partition}] [{r.from_offset}, {r.until_offset})" for r in first.ranges]
    # 12 clicks, one bad record and a transaction marker in each of the two partitions
    assert sum(r.until_offset - r.from_offset for r in first.ranges) == 15
    assert "PLANNED" in rows[str(undecided)].text
    doubt = driver.find_element(By.ID, "in-doubt").text
    assert f"epoch {undecided} PLANNED" in doubt and "undecided" in doubt
    letters = driver.find_elements(By.CSS_SELECTOR, "table.dead-letters tbody tr")
    assert len(letters) == 1
    assert "malformed_json: " in letters[0].text and "'{oops' (5 bytes)" in letters[0].text
    form = driver.find_element(By.CSS_SELECTOR, "form.filters")
    form.find_element(By.NAME, "text").send_keys("no such payload")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "p.empty.dead-letters"))
    assert "0 dead letters" in driver.find_element(By.ID, "dead-letters").text
    driver.get(f"{console.url}/onceflow/?pipeline={console.pipeline}&code=malformed_json&text=oops")
    assert len(driver.find_elements(By.CSS_SELECTOR, "table.dead-letters tbody tr")) == 1
    lag = driver.find_element(By.ID, "lag").text
    waiting = sum(r.until_offset - r.from_offset for r in planned.ranges)  # what it would read
    assert console.topic in lag and f"total lag {waiting}" in lag and waiting >= 3
    driver.save_screenshot(str(shots / "console-epochs.png"))

    # The same page in Airflow's navigation ("Epochs"), inside Airflow's own frame.
    driver.get(f"{console.url}/plugin/onceflow-epochs")
    frame = wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "iframe[title=Epochs]"))
    driver.switch_to.frame(frame[0])
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "table.epochs"))
    assert console.pipeline in driver.find_element(By.CSS_SELECTOR, "h2").text
    driver.switch_to.default_content()
    driver.save_screenshot(str(shots / "console-in-airflow.png"))


def test_the_dag_run_page_shows_that_runs_epoch(console: Console, browser_factory: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = browser_factory()
    log_in(driver, console, "admin", f"/dags/{console.dag_id}/runs/{console.run_id}/plugin/onceflow-epoch")
    frame = wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "iframe[title=Epoch]"))
    driver.switch_to.frame(frame[0])
    heading = wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".run-view h2"))
    assert heading[0].text == f"epoch 1 of pipeline {console.pipeline} COMMITTED"
    assert "1 dead letter(s) in this epoch" in driver.find_element(By.CSS_SELECTOR, ".run-view").text
    driver.switch_to.default_content()
    driver.save_screenshot(str(shots / "console-dag-run.png"))


def test_an_editor_aborts_the_undecided_epoch_and_is_refused_the_committed_one(
    console: Console, undecided: int, browser_factory: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser_factory()
    console_page(driver, console, "admin")
    driver.find_element(By.CSS_SELECTOR, f'button.act-abort[data-epoch="{undecided}"]').click()
    wait_for(driver, lambda d: d.switch_to.alert).accept()
    answer = wait_for(
        driver,
        lambda d: (
            d.find_element(By.ID, "action-result").text
            if d.find_elements(By.CSS_SELECTOR, ".action-result.done")
            else None
        ),
    )
    assert f"epoch {undecided} of pipeline '{console.pipeline}' (ABORTED)" in str(answer)
    with Ledger.connect(console.ledger_url) as ledger:
        aborted = ledger.epoch(console.pipeline, undecided)
        first = ledger.epoch(console.pipeline, 1)
    assert aborted.status is EpochStatus.ABORTED
    assert aborted.abort_reason == "aborted by hand with the epochs console by admin"
    assert "nothing in doubt" in driver.find_element(By.ID, "in-doubt").text

    refused = run_action(driver, "abort", 1)
    assert refused.splitlines()[0] == abort_refusal(first)  # the coordinator's words, as the CLI prints them
    assert "abort refused: cannot abort epoch 1" in refused
    assert status_of(console, 1) is EpochStatus.COMMITTED
    driver.save_screenshot(str(shots / "console-refusal.png"))
    # What a form on another site could send (no JSON) is turned away before anything happens.
    status, _ = post_from_page(
        driver, f"/onceflow/api/pipelines/{console.pipeline}/actions/recover", "text/plain"
    )
    assert status == 415


def test_a_viewer_may_look_but_is_refused_every_action(
    console: Console, undecided: int, browser_factory: Any
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser_factory()
    console_page(driver, console, "viewer")
    assert driver.find_elements(By.ID, "action-form") == []
    assert "You may look, not act" in driver.find_element(By.ID, "actions").text
    with Ledger.connect(console.ledger_url) as ledger:
        before = ledger.epoch(console.pipeline, undecided)
    # The server refuses whatever the page shows: the same requests the form would send, from the
    # viewer's signed-in browser, on an undecided epoch that an abort (or a recover, once its owner's
    # lease ends) would change.
    for action in ("abort", "commit", "recover"):
        status, body = post_from_page(
            driver, f"/onceflow/api/pipelines/{console.pipeline}/actions/{action}", epoch=undecided
        )
        assert status == 403, (action, body)
        assert json.loads(body)["detail"] == f"forbidden: viewer may not edit the DAG '{console.dag_id}'"
    with Ledger.connect(console.ledger_url) as ledger:
        after = ledger.epoch(console.pipeline, undecided)
    assert (after.status, after.attempt_token, after.abort_reason) == (
        EpochStatus.PLANNED,
        before.attempt_token,
        None,
    )
