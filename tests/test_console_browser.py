"""The web console in a real browser: headless Chromium (Debian's, /usr/bin/chromium, installed by
scripts/install-chromium.sh, which ``make test`` runs) driven by Playwright, against a real daemon
with bearer tokens and a minicluster of 2 agents x 2 GPUs that runs the gangs
(tests/console_support.py: ``ops`` is a cluster admin, ``alice`` may view /research only).

Every page is reached the way a user reaches it: the login form first (the daemon answers 401
without a token), then the navigation's hash routes; the page redraws on the daemon's events, never
reloads. Tests wait on the page's state (selectors, and ``body[data-drawn]``, the route the page
last drew, set once its first load is on the page), never on time. A page error or a console error
fails the test (the browser's own "Failed to load resource" lines excepted: the page asks, on
purpose, for what a caller may not see). The daemon's Content-Security-Policy (self only) holds:
the tests drive the page without bypassing it.

Screenshots of each page shown go to ``$PELOTON_SCREENSHOTS`` when set (a directory, relative to
the current one), else to the test's tmp_path, as ``console-<page>.png``. The README's picture is
written by running, from the checkout's root::

    PELOTON_SCREENSHOTS=docs .venv/bin/pytest -q tests/test_console_browser.py

which writes docs/console-cluster.png (the demo's gang on the cluster) and the other pages'
pictures beside it (only console-cluster.png is kept in the repository).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from console_support import USERS, ConsoleDaemon, console_daemon, get, task_states
from daemon import wait_for
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright
from tls_support import TestCa

from peloton.client import PelotonClient
from peloton.v1 import job_pb2

CHROMIUM = "/usr/bin/chromium"
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
OPS, ALICE = "ops-token", "alice-token"
# How long the page may take to show what the cluster does (a gang starting on the minicluster).
SHOW_MS = 60_000
# A task that runs until a file exists.
WAIT = "while [ ! -e {stop} ]; do sleep 0.1; done"
VIEWPORT = {"width": 1280, "height": 800}


def screenshots_dir(tmp_path: Path) -> Path:
    configured = os.environ.get("PELOTON_SCREENSHOTS")
    directory = Path(configured).resolve() if configured else tmp_path
    directory.mkdir(parents=True, exist_ok=True)
    return directory


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"{CHROMIUM} is missing: run scripts/install-chromium.sh (make chromium) as root"
        )
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleDaemon]:
    with console_daemon(tmp_path_factory.mktemp("console"), tokens=USERS) as d:
        wait_for(
            lambda: get(d.url, "/api/v1/cluster", OPS)["summary"]["hosts_up"] == 2,
            30,
            "both agents of the minicluster up",
            interval=0.1,
            state=lambda: get(d.url, "/api/v1/cluster", OPS)["summary"],
        )
        yield d


@pytest.fixture(scope="module")
def grpc(console: ConsoleDaemon) -> Iterator[PelotonClient]:
    """The daemon's gRPC API as ops: what the page shows is checked against it."""
    client = PelotonClient(f"127.0.0.1:{console.server.grpc_port}", token=OPS, timeout=10)
    yield client
    client.close()


class Tab:
    """A signed-in page of the console, in a browser context of its own (its own cookie)."""

    def __init__(self, page: Page, url: str, shots: Path) -> None:
        self.page = page
        self.url = url
        self.shots = shots

    def login(self, token: str, user: str, shot: bool = False) -> None:
        """Sign in through the page's form; with ``shot``, try a wrong token first and take a
        picture of the form."""
        self.page.goto(f"{self.url}/#/cluster")
        form = self.page.locator("[data-login]")
        expect(form, "the login form (the daemon answers 401 without a token)").to_be_visible()
        if shot:
            # A wrong token first: refused in words, in the form.
            form.locator("input[name=token]").fill("not-a-token")
            form.locator("button[type=submit]").click()
            refused = form.locator("[data-login-error]")
            expect(refused, "the daemon's refusal").to_have_text("token not recognised")
            self.shot("login")
        form.locator("input[name=token]").fill(token)
        form.locator("button[type=submit]").click()
        expect(self.page.locator("[data-caller]"), "the signed-in caller").to_have_text(user)
        self.wait_drawn("/cluster")
        live = self.page.locator("[data-live]")
        expect(live, "the page's event stream open").to_have_attribute("data-live", "live")

    def wait_drawn(self, route: str) -> None:
        """Wait until the page drew ``route``: its first load, data or error (the page clears
        ``body[data-drawn]`` when the route changes and sets it once it drew)."""
        expect(self.page.locator("body"), f"the page to draw #{route}").to_have_attribute(
            "data-drawn", f"#{route}"
        )

    def goto(self, route: str) -> None:
        """Follow a hash route, as the navigation's links do (no reload), and wait until the
        page drew it."""
        self.page.evaluate("route => { location.hash = route; }", f"#{route}")
        self.wait_drawn(route)

    def shot(self, name: str) -> Path:
        """The page down to the end of its content (at most 2,400 pixels)."""
        path = self.shots / f"console-{name}.png"
        bottom = self.page.evaluate("document.querySelector('main').getBoundingClientRect().bottom")
        height = max(VIEWPORT["height"] // 2, min(int(bottom), 2400))
        clip = {"x": 0, "y": 0, "width": VIEWPORT["width"], "height": height}
        self.page.screenshot(path=str(path), full_page=True, clip=clip)
        return path


@pytest.fixture
def open_tab(
    browser: Browser, console: ConsoleDaemon, tmp_path: Path
) -> Iterator[Callable[..., Tab]]:
    """``open_tab(token, user)``: a new tab signed in through the login form. The test fails
    if a page throws or logs an error."""
    shots = screenshots_dir(tmp_path)
    errors: list[str] = []
    contexts = []

    def on_console(message: ConsoleMessage) -> None:
        # The browser logs each 4xx answer itself; the page shows those in words.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            errors.append(f"console error: {message.text}")

    def open_tab(token: str, user: str, shot: bool = False, url: str = "", **options: Any) -> Tab:
        context = browser.new_context(viewport=VIEWPORT, **options)
        context.set_default_timeout(SHOW_MS)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
        page.on("console", on_console)
        tab = Tab(page, url or console.url, shots)
        tab.login(token, user, shot)
        return tab

    yield open_tab
    for context in contexts:
        context.close()  # before the daemon stops: no reconnecting event stream
    assert not errors, errors


def job_state(grpc: PelotonClient, job_id: str) -> str:
    return job_pb2.JobState.Name(grpc.get_job(job_id).state).removeprefix("JOB_STATE_")


def wait_job(grpc: PelotonClient, job_id: str, *states: str) -> None:
    wait_for(
        lambda: job_state(grpc, job_id) in states,
        SHOW_MS / 1000,
        f"job {job_id} {' or '.join(states)}",
        interval=0.1,
        state=lambda: (job_state(grpc, job_id), grpc.list_tasks(job_id).tasks),
    )


def end(grpc: PelotonClient, *job_ids: str) -> None:
    """Kill the jobs and wait until they ended: the next test finds every GPU free."""
    for job_id in job_ids:
        if job_state(grpc, job_id) not in ("SUCCEEDED", "FAILED", "KILLED"):
            grpc.kill_job(job_id)
    for job_id in job_ids:
        wait_job(grpc, job_id, "SUCCEEDED", "FAILED", "KILLED")


def running_hosts(grpc: PelotonClient, job_id: str) -> dict[int, str]:
    """Each task's host, as ListTasks says, once every task is RUNNING."""

    def hosts() -> dict[int, str] | None:
        tasks = grpc.list_tasks(job_id).tasks
        if any(t.state != job_pb2.TASK_STATE_RUNNING for t in tasks):
            return None
        return {t.instance_id: t.current.host for t in tasks}

    return wait_for(
        hosts,
        SHOW_MS / 1000,
        f"every task of {job_id} RUNNING",
        interval=0.1,
        state=lambda: grpc.list_tasks(job_id).tasks,
    )


# ---------------------------------------------------------------- tests


def test_the_gang_is_on_its_hosts_gpus_while_it_runs_and_leaves_them_when_it_ends(
    console: ConsoleDaemon, grpc: PelotonClient, open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    """The demo's gang (4 tasks of 1 GPU on 2 agents x 2 GPUs), submitted while the page is open:
    its GPUs light up on the hosts ListTasks names, the job page shows it, its logs follow live,
    and it leaves the GPUs when it ends; the page never reloads."""
    tab = open_tab(OPS, "ops", shot=True)
    page = tab.page
    page.evaluate("window.stillTheSamePage = true")
    stop = tmp_path / "stop"
    job_id = console.submit(
        4, "echo hello from the console; " + WAIT.format(stop=stop), "/research", name="demo"
    )
    try:
        cells = page.locator(f'[data-gpu][data-job="{job_id}"]')
        expect(cells, f"the 4 GPUs of gang {job_id} on the cluster page").to_have_count(4)
        hosts = running_hosts(grpc, job_id)
        expect(cells, "one GPU cell per task").to_have_count(4)
        drawn = {
            int(cell.get_attribute("data-instance") or -1): cell.get_attribute("data-host")
            for cell in cells.all()
        }
        assert drawn == hosts, (drawn, hosts)
        for host in set(hosts.values()):
            on_host = page.locator(
                f'[data-rack] [data-host-cell="{host}"] [data-gpu][data-job="{job_id}"]'
            )
            expect(on_host).to_have_count(sum(1 for h in hosts.values() if h == host))
        title = cells.first.get_attribute("title") or ""
        assert job_id in title and "rank" in title and "/research" in title, title
        expect(page.locator('[data-summary="utilization"]')).to_have_text("100%")
        tab.shot("cluster")

        tab.goto(f"/jobs/{job_id}")
        job_page = page.locator(f'[data-job-page="{job_id}"]')
        expect(job_page.locator("h1 [data-state]")).to_have_text("RUNNING")
        expect(job_page.locator("[data-gang-host]")).to_have_count(len(set(hosts.values())))
        expect(job_page.locator("[data-timeline]")).to_contain_text("RUNNING")
        expect(job_page.locator("[data-logs]"), "task 0's stdout").to_contain_text(
            "hello from the console"
        )
        tab.shot("job")

        tab.goto("/pools")
        expect(page.locator('[data-pool="/research"] [data-kind="gpu"]')).to_be_visible()
        tab.shot("pools")
        tab.goto("/jobs")
        row = page.locator(f'[data-job-row="{job_id}"]')
        expect(row).to_have_attribute("data-state", "RUNNING")
        tab.shot("jobs")
        pending = page.locator('[data-filters] input[name="state"][value="PENDING"]')
        pending.check()
        expect(row, "a RUNNING job, filtered out by state=PENDING").to_have_count(0)
        assert "state=PENDING" in page.url
        pending.uncheck()
        expect(row).to_be_visible()

        tab.goto("/cluster")
        expect(cells).to_have_count(4)
        stop.touch()
        expect(cells, f"gang {job_id} gone from the GPUs once it ended").to_have_count(0)
        assert job_state(grpc, job_id) == "SUCCEEDED"
        expect(page.locator('[data-gpu][data-state="free"]')).to_have_count(4)
        assert page.evaluate("window.stillTheSamePage") is True  # redrawn, never reloaded
    finally:
        stop.touch()
        end(grpc, job_id)


def test_a_waiting_job_shows_its_reason_in_the_queue(
    console: ConsoleDaemon, grpc: PelotonClient, open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    blocker = console.submit(4, WAIT.format(stop=stop), "/research", name="holds-every-gpu")
    waiting = ""
    try:
        running_hosts(grpc, blocker)
        waiting = console.submit(2, "true", "/research", name="waits")
        tab = open_tab(OPS, "ops")
        tab.goto("/queue")
        reason = wait_for(
            lambda: grpc.get_job(waiting).message,
            SHOW_MS / 1000,
            f"the resource manager to say why {waiting} waits",
            interval=0.1,
            state=lambda: grpc.get_job(waiting),
        )
        gang = tab.page.locator(f'[data-queue-pool="/research"] [data-queue-job="{waiting}"]')
        expect(gang.locator("[data-reason]"), "the waiting gang's reason").to_contain_text(reason)
        expect(gang).to_contain_text("waits")
        tab.shot("queue")
        # Its job page says so too.
        tab.goto(f"/jobs/{waiting}")
        expect(tab.page.locator("[data-job-reason]")).to_contain_text(reason)
    finally:
        stop.touch()
        end(grpc, *(j for j in (waiting, blocker) if j))


def test_restart_and_kill_from_the_job_page(
    console: ConsoleDaemon, grpc: PelotonClient, open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    """Restart, then kill, each confirmed in the page: the job restarts (a second attempt, whose
    log the page follows, the first's still selectable) and ends KILLED, as the API says."""
    command = "echo this is $PELOTON_ATTEMPT_ID; " + WAIT.format(stop=tmp_path / "never")
    job_id = console.submit(2, command, "/research", name="to-kill")
    try:
        tab = open_tab(OPS, "ops")
        page = tab.page
        tab.goto(f"/jobs/{job_id}")
        badge = page.locator(f'[data-job-page="{job_id}"] h1 [data-state]')
        expect(badge).to_have_text("RUNNING")
        logs = page.locator("[data-logs]")
        expect(logs, "rank 0's first attempt's stdout").to_have_text(f"this is {job_id}-0-1\n")

        page.locator('[data-action="restart"]').click()
        page.locator("[data-confirm]").click()
        expect(logs, "the page following rank 0's second attempt").to_have_text(
            f"this is {job_id}-0-2\n"
        )
        wait_for(
            lambda: {t.current.attempt for t in grpc.list_tasks(job_id).tasks} == {2},
            SHOW_MS / 1000,
            f"every task of {job_id} in its second attempt",
            interval=0.1,
            state=lambda: grpc.list_tasks(job_id).tasks,
        )
        expect(page.locator("[data-timeline]")).to_contain_text("restart")
        page.locator("[data-log-attempt]").select_option("1")
        expect(logs, "rank 0's first attempt's stdout again").to_have_text(
            f"this is {job_id}-0-1\n"
        )
        expect(badge).to_have_text("RUNNING")

        kill = page.locator('[data-action="kill"]')
        # Asked first, in the page; cancelled, nothing happens.
        kill.click()
        page.locator("[data-cancel]").click()
        expect(page.locator("[data-confirm]")).to_have_count(0)
        assert get(console.url, f"/api/v1/jobs/{job_id}", OPS)["job"]["goal"] == "RUN"
        kill.click()
        confirm = page.locator("[data-confirm]")
        expect(confirm).to_be_visible()
        tab.shot("kill")
        confirm.click()
        wait_job(grpc, job_id, "KILLED")
        expect(badge).to_have_text("KILLED")
        expect(kill).to_be_disabled()
        expect(page.locator("[data-timeline]")).to_contain_text("KILLED")
        tab.shot("job-killed")
    finally:
        end(grpc, job_id)


def test_a_user_without_view_on_a_pool_does_not_see_its_jobs(
    console: ConsoleDaemon, grpc: PelotonClient, open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    never = WAIT.format(stop=tmp_path / "never")
    hidden = console.submit(1, never, "/vision", name="vision-secret")
    shown = console.submit(1, never, "/research", name="research-open")
    try:
        running_hosts(grpc, hidden)
        running_hosts(grpc, shown)
        alice = open_tab(ALICE, "alice")
        page = alice.page
        # The cluster: her job's GPU, and one in use by a job she may not know of.
        expect(page.locator(f'[data-gpu][data-job="{shown}"]')).to_have_count(1)
        expect(page.locator('[data-gpu][data-state="used"][data-hidden]')).to_have_count(1)
        expect(page.locator(f'[data-gpu][data-job="{hidden}"]')).to_have_count(0)
        assert hidden not in page.content() and "vision-secret" not in page.content()
        # Not a cluster admin: a host's panel has no drain button for her.
        page.locator('[data-open-host="gpu-r1-1"]').click()
        expect(page.locator('[data-host-panel="gpu-r1-1"]')).to_be_visible()
        expect(page.locator("[data-host-action]")).to_have_count(0)
        alice.shot("cluster-alice")
        alice.goto("/jobs")
        expect(page.locator(f'[data-job-row="{shown}"]')).to_be_visible()
        expect(page.locator(f'[data-job-row="{hidden}"]')).to_have_count(0)
        assert "vision-secret" not in page.content()
        alice.goto("/queue")
        assert "vision-secret" not in page.content()
        # She may view her pool's job, not stop it.
        alice.goto(f"/jobs/{shown}")
        expect(page.locator('[data-action="kill"]')).to_be_disabled()
        # Given the other's id, the page says in words why it shows nothing.
        alice.goto(f"/jobs/{hidden}")
        expect(page.locator("[data-error]")).to_contain_text(re.compile("alice may not view"))
        expect(page.locator(f'[data-job-page="{hidden}"] h1')).to_have_count(0)
        assert "vision-secret" not in page.content()
        alice.shot("job-refused")
        # ops sees both.
        ops = open_tab(OPS, "ops")
        ops.goto("/jobs")
        expect(ops.page.locator(f'[data-job-row="{hidden}"]')).to_be_visible()
        expect(ops.page.locator(f'[data-job-row="{shown}"]')).to_be_visible()
    finally:
        end(grpc, hidden, shown)


def test_an_api_error_is_shown_in_words(
    console: ConsoleDaemon, open_tab: Callable[..., Tab]
) -> None:
    tab = open_tab(OPS, "ops")
    tab.goto("/jobs/no-such-job")
    expect(tab.page.locator("[data-error]")).to_be_visible()
    expect(tab.page.locator("[data-view-error]")).to_contain_text("no-such-job")
    tab.page.locator("[data-dismiss]").click()
    expect(tab.page.locator("[data-error]")).to_be_hidden()


def test_an_admin_drains_and_undrains_a_host_from_its_cell(
    grpc: PelotonClient, open_tab: Callable[..., Tab]
) -> None:
    tab = open_tab(OPS, "ops")
    page = tab.page
    host = "gpu-r1-1"
    cell = page.locator(f'[data-rack="r1"] [data-host-cell="{host}"]')
    try:
        cell.locator(f'[data-open-host="{host}"]').click()
        panel = page.locator(f'[data-host-panel="{host}"]')
        panel.locator('[data-host-action="drain"]').click()
        page.locator("[data-confirm]").click()
        expect(cell, f"{host} drawn DRAINING").to_have_attribute("data-host-state", "DRAINING")
        assert grpc.get_host(host).state == "DRAINING"
        expect(cell.locator('[data-gpu][data-state="draining"]')).to_have_count(2)
        tab.shot("draining")
        panel.locator('[data-host-action="undrain"]').click()
        page.locator("[data-confirm]").click()
        expect(cell, f"{host} drawn UP again").to_have_attribute("data-host-state", "UP")
        assert grpc.get_host(host).state == "UP"
        expect(cell.locator('[data-gpu][data-state="free"]')).to_have_count(2)
    finally:
        if grpc.get_host(host).state == "DRAINING":
            grpc.undrain_host(host)


def test_over_tls_the_login_form_sets_a_secure_cookie_and_the_page_stays_live(
    open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    """The daemon's TLS: the page, its API and its event stream over HTTPS (the test's own CA,
    which the browser is told to accept); the session cookie is Secure and HttpOnly; a waiting
    job (no Mesos master here: no hosts) appears in the queue with its reason, live."""
    server = TestCa(tmp_path / "ca").server()
    options = {"tls_cert_file": str(server.cert_file), "tls_key_file": str(server.key_file)}
    (tmp_path / "tls").mkdir()
    with console_daemon(tmp_path / "tls", cluster=False, tokens=USERS, **options) as d:
        assert d.url.startswith("https://127.0.0.1:")
        tab = open_tab(OPS, "ops", url=d.url, ignore_https_errors=True)
        page = tab.page
        cookies = {c["name"]: c for c in page.context.cookies()}
        session = cookies["peloton_session"]
        assert (session["secure"], session["httpOnly"]) == (True, True), session
        assert OPS not in page.content()
        expect(page.locator('[data-summary="hosts"]')).to_have_text("0")
        tab.goto("/queue")
        job_id = d.submit(1, "true", "/research", name="waits-for-hosts")
        wait_for(
            lambda: d.server.jobs is not None and d.server.jobs.get_job(job_id).message,
            SHOW_MS / 1000,
            f"the resource manager to say why {job_id} waits",
            interval=0.1,
            state=lambda: task_states(d, job_id),
        )
        assert d.server.jobs is not None
        reason = d.server.jobs.get_job(job_id).message
        gang = page.locator(f'[data-queue-job="{job_id}"] [data-reason]')
        expect(gang, "the waiting job's reason, drawn on an event over TLS").to_contain_text(reason)
        page.locator("[data-signout]").click()
        expect(page.locator("[data-login]"), "the login form again, signed out").to_be_visible()
        page.context.close()  # before the daemon stops
