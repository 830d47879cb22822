"""A local web dashboard of one queue (extra ``[dashboard]``: Starlette served by uvicorn).

``ringq --dir DIR dashboard --port N`` serves it on 127.0.0.1 only.  It is read-only unless
started with ``--allow-actions``: requeue, discard, purge, cancel, pause and resume are POSTs
refused with 403 otherwise.

Every request must name the dashboard itself in its ``Host`` header (``127.0.0.1:PORT``,
``localhost:PORT`` or ``[::1]:PORT``), else 403: a page of another site that rebinds its own name
to 127.0.0.1 (DNS rebinding) is refused.  Every state-changing request (any method but GET, HEAD,
OPTIONS) must also come from the dashboard's own origin (``Origin`` header, or ``Referer`` when a
browser sends no ``Origin``) and carry the per-process secret token of the served pages in the
``X-Ringq-CSRF`` header, else 403: a cross-site form post or ``fetch`` cannot supply it
(cross-site request forgery, OWASP's "synchronizer token" defence).
Pages refresh live from a server-sent event stream (``/events``) that sends the overview once a
second; the overview chart (throughput and error rate over time) is inline SVG drawn by the
page's own script from those events, so nothing is fetched from elsewhere.

JSON endpoints return what the command line prints with ``--json``:

=========================  ==========================================
endpoint                   same JSON as
=========================  ==========================================
``/api/stats``             ``ringq stats --json``
``/api/list?state=S``      ``ringq list --json --state S``
``/api/search?...``        a page of ``ringq list --json --state S
                           --key K --priority P --id ID --error T``
                           (ringq/web/search_page.py)
``/api/dlq``               ``ringq dlq --json``
``/api/verify``            ``ringq verify --json`` (runs a verify)
``/api/overview``          the event stream's payload (ringq/web/view.py)
``/api/leases``            in-flight leases with holder and deadline
``/api/dead-groups``       dead letters grouped by error
``/api/jobs/{id}``         ``ringq get --json ID`` plus payload and
                           result previews
``/api/storage``           files and segments, last verify
=========================  ==========================================

Actions (POST, ``--allow-actions``) answer as the command line does with ``--json``:
``/api/actions/cancel?id=ID&id=...`` as ``ringq cancel ID...``, ``/api/actions/pause[?key=K]``
and ``/api/actions/resume[?key=K]`` as ``ringq pause|resume [--key K]``,
``/api/actions/requeue[?id=ID]`` as ``ringq dlq --requeue``, ``/api/actions/purge`` as
``ringq purge --yes``; ``/api/actions/discard?id=ID&id=...`` gives ``{"discarded": n}``.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import json
import secrets
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

try:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the dashboard needs starlette and uvicorn: pip install 'ringq[dashboard]'"
    ) from exc

from ringq.backend import check_port
from ringq.errors import JobFinishedError, JobNotFoundError, NotLeasedError
from ringq.local.queue import Queue

from . import search_page, view

__all__ = ["make_app", "serve", "EVENT_INTERVAL", "CSRF_HEADER", "LOOPBACK_NAMES"]

EVENT_INTERVAL = 1.0  # seconds between server-sent overview events
STOP_POLL = 0.1  # seconds between an event stream's checks for a shutdown
WAITING_LIMIT = 200  # jobs the "Waiting" page lists: a page, not an export (ringq list has all)
CSRF_HEADER = "X-Ringq-CSRF"  # request header carrying the page's secret token on POSTs
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")  # host names a request may use
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# the states ``ringq list --state`` accepts ("ready" includes delayed jobs)
LIST_STATES = ("ready", "leased", "done", "dead", "cancelled", "expired", "delayed")


class _Guard:
    """ASGI middleware: the Host check on every request, origin and token on state changes.

    ``port`` None accepts a loopback name with any port (for an application not yet bound).
    """

    def __init__(self, app: Any, port: int | None, token: str) -> None:
        self.app = app
        self.port = port
        self.token = token

    def _host_ok(self, host: str) -> bool:
        name, sep, port = host.rpartition(":")
        if not sep or name.lower() not in LOOPBACK_NAMES or not port.isdigit():
            return False
        return self.port is None or int(port) == self.port

    def refusal(self, scope: dict[str, Any]) -> str | None:
        """Why the request is refused, or None to let it through."""
        headers: dict[str, str] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        host = headers.get("host", "")
        if not self._host_ok(host):
            return f"Host header {host!r} is not this dashboard (use http://127.0.0.1:PORT/)"
        if scope.get("method", "GET") in SAFE_METHODS:
            return None
        own = f"http://{host}"
        origin = headers.get("origin")
        if origin is not None:
            if origin.lower() != own.lower():
                return f"cross-origin request from {origin!r} refused"
        else:
            referer = headers.get("referer")
            if referer is None or not (referer.lower() + "/").startswith(own.lower() + "/"):
                return "a state-changing request needs a same-origin Origin or Referer header"
        sent = headers.get(CSRF_HEADER.lower(), "")
        if not hmac.compare_digest(sent.encode("latin-1"), self.token.encode()):
            return f"missing or wrong {CSRF_HEADER} token (actions are sent from the dashboard's pages)"
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            why = self.refusal(scope)
            if why is not None:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await JSONResponse({"error": why}, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _State:
    """The queue, a lock serialising the work done on it from request threads, the last verify."""

    def __init__(self, queue: Queue, allow_actions: bool) -> None:
        self.queue = queue
        self.allow_actions = allow_actions
        self.token = secrets.token_urlsafe(32)  # this process's CSRF token, embedded in pages
        self.lock = threading.Lock()
        self.last_verify: dict[str, Any] | None = None

    async def run(self, fn: Any, *args: Any) -> Any:
        def call() -> Any:
            with self.lock:
                return fn(*args)

        return await asyncio.to_thread(call)

    def verify(self) -> dict[str, Any]:
        result = view.verify(str(self.queue.dir), self.queue.name)
        self.last_verify = {"time": time.time(), **result}
        return result


def make_app(
    queue: Queue,
    *,
    allow_actions: bool = False,
    port: int | None = None,
    stopping: Callable[[], bool] | None = None,
) -> Any:
    """The ASGI application for ``queue``.  ``allow_actions`` enables the POST actions.

    ``port``: the TCP port the application is served on; requests whose ``Host`` header names
    another port, or a name other than ``LOOPBACK_NAMES``, get 403 (None: any port).
    ``stopping()``: true once the server shuts down; open event streams then end (within
    ``STOP_POLL`` seconds) so that a graceful shutdown does not wait on an open browser tab.
    """
    st = _State(queue, allow_actions)
    q = queue

    async def page(request: Request) -> HTMLResponse:
        name = request.path_params.get("page", "overview")
        if name not in PAGES:
            return HTMLResponse(_layout("not found", "<p>No such page.</p>", st), status_code=404)
        return HTMLResponse(_layout(name, PAGES[name], st))

    async def job_page(request: Request) -> HTMLResponse:
        jid = request.path_params["job_id"]
        # A JSON string literal inside <script>: "<" escaped so no id can close the element.
        body = JOB_PAGE.replace("__JOB_ID__", json.dumps(jid).replace("<", "\\u003c"))
        return HTMLResponse(_layout("job", body, st))

    async def api_stats(_request: Request) -> JSONResponse:
        return JSONResponse(await st.run(view.stats, q))

    async def api_list(request: Request) -> JSONResponse:
        state = request.query_params.get("state")
        limit = request.query_params.get("limit")
        if state is not None and state not in LIST_STATES:
            return JSONResponse({"error": f"unknown state {state!r}"}, status_code=400)
        try:
            lim = None if limit in (None, "", "0") else int(limit)
        except ValueError:
            return JSONResponse(
                {"error": f"limit must be an integer, got {limit!r}"}, status_code=400
            )
        return JSONResponse(await st.run(view.jobs, q, state, lim))

    async def api_search(request: Request) -> JSONResponse:
        try:
            kw = search_page.query_of(request.query_params)
            page = await st.run(lambda: q.search(**kw))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(page.to_dict())

    async def api_dlq(_request: Request) -> JSONResponse:
        return JSONResponse(await st.run(view.dead, q))

    async def api_verify(_request: Request) -> JSONResponse:
        return JSONResponse(await st.run(st.verify))

    async def api_overview(_request: Request) -> JSONResponse:
        return JSONResponse(await st.run(view.overview, q))

    async def api_leases(_request: Request) -> JSONResponse:
        return JSONResponse(await st.run(view.leases, q))

    async def api_dead_groups(_request: Request) -> JSONResponse:
        return JSONResponse(await st.run(view.dead_groups, q))

    async def api_job(request: Request) -> JSONResponse:
        try:
            return JSONResponse(await st.run(view.job, q, request.path_params["job_id"]))
        except JobNotFoundError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)

    async def api_storage(_request: Request) -> JSONResponse:
        data = await st.run(view.storage, q)
        data["last_verify"] = st.last_verify
        return JSONResponse(data)

    async def events(request: Request) -> StreamingResponse:
        def ending() -> bool:
            return stopping is not None and stopping()

        async def stream() -> AsyncIterator[str]:
            while not ending() and not await request.is_disconnected():
                data = await st.run(view.overview, q)
                yield f"event: overview\ndata: {json.dumps(data)}\n\n"
                next_at = time.monotonic() + EVENT_INTERVAL
                while not ending() and time.monotonic() < next_at:
                    await asyncio.sleep(min(STOP_POLL, max(0.0, next_at - time.monotonic())))

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    def action(fn: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            if not st.allow_actions:
                return JSONResponse(
                    {
                        "error": "read-only dashboard: start it with --allow-actions to change the queue"
                    },
                    status_code=403,
                )
            try:
                return JSONResponse(await st.run(fn, request))
            except JobNotFoundError as exc:
                return JSONResponse({"error": str(exc)}, status_code=404)
            except (NotLeasedError, JobFinishedError) as exc:
                return JSONResponse({"error": str(exc)}, status_code=409)
            except ValueError as exc:  # a key pause() refuses: too long, or too many paused
                return JSONResponse({"error": str(exc)}, status_code=400)

        return endpoint

    def requeue(request: Request) -> dict[str, Any]:
        jid = request.query_params.get("id")
        return {
            "requeued": q.requeue_dead(jid or None)
        }  # same JSON as `ringq dlq --requeue --json`

    def discard(request: Request) -> dict[str, Any]:
        ids = request.query_params.getlist("id")
        for jid in ids:
            q.discard_dead(jid)
        return {"discarded": len(ids)}

    def purge(_request: Request) -> dict[str, Any]:
        return {"purged": q.purge()}  # same JSON as `ringq purge --yes --json`

    def cancel(request: Request) -> list[dict[str, Any]]:
        # same JSON as `ringq cancel --json ID...`: each job's snapshot after its cancel
        return [q.cancel(jid).to_dict() for jid in request.query_params.getlist("id")]

    def pause(request: Request) -> dict[str, Any]:
        q.pause(request.query_params.get("key"))
        return q.paused()  # same JSON as `ringq pause --json [--key K]`

    def resume(request: Request) -> dict[str, Any]:
        q.resume(request.query_params.get("key"))
        return q.paused()  # same JSON as `ringq resume --json [--key K]`

    routes = [
        Route("/", page),
        Route("/page/{page}", page),
        Route("/job/{job_id:path}", job_page),
        Route("/events", events),
        Route("/api/stats", api_stats),
        Route("/api/list", api_list),
        Route("/api/search", api_search),
        Route("/api/dlq", api_dlq),
        Route("/api/verify", api_verify),
        Route("/api/overview", api_overview),
        Route("/api/leases", api_leases),
        Route("/api/dead-groups", api_dead_groups),
        Route("/api/jobs/{job_id:path}", api_job),
        Route("/api/storage", api_storage),
        Route("/api/actions/requeue", action(requeue), methods=["POST"]),
        Route("/api/actions/discard", action(discard), methods=["POST"]),
        Route("/api/actions/purge", action(purge), methods=["POST"]),
        Route("/api/actions/cancel", action(cancel), methods=["POST"]),
        Route("/api/actions/pause", action(pause), methods=["POST"]),
        Route("/api/actions/resume", action(resume), methods=["POST"]),
        Route("/favicon.ico", lambda _r: Response(status_code=204)),
    ]
    return _Guard(Starlette(routes=routes), port, st.token)


def serve(queue: Queue, port: int, *, allow_actions: bool = False, ready: Any = None) -> None:
    """Serve the dashboard on ``127.0.0.1:port`` until interrupted (port 0: a free one).

    ``ready(port)`` is called once the socket listens.  Raises KeyboardInterrupt when SIGINT or
    SIGTERM stopped the server, OSError if the port is taken, ValueError if ``port`` is not an int
    from 0 to 65535.
    """
    check_port(port)
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    servers: list[Any] = []  # the server, once made: the app asks it whether it is shutting down
    app = make_app(
        queue,
        allow_actions=allow_actions,
        port=sock.getsockname()[1],
        stopping=lambda: bool(servers) and servers[0].should_exit,
    )
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    servers.append(server)
    # Until the server takes SIGTERM and SIGINT over as it starts: a signal sent on the ready
    # line asks it to stop at once instead of killing the process with the queue open.
    main = threading.current_thread() is threading.main_thread()
    previous = {}
    if main:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *_: setattr(server, "should_exit", True))
    try:
        if ready is not None:
            ready(sock.getsockname()[1])
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # The server stops only when a signal asked it to.  It re-raises the signal as it returns,
    # which does nothing to a process started with SIGINT ignored (a shell without job control
    # starts background jobs so): raise it here every time, so that it always ends as interrupted.
    raise KeyboardInterrupt


# -- pages ----------------------------------------------------------------------------------------------

NAV = [
    ("overview", "Overview"),
    ("waiting", "Waiting"),
    ("leases", "In flight"),
    ("dead", "Dead letters"),
    ("search", "Search"),
    ("storage", "Storage"),
]

# Every control that sends an action (CSS selectors): hidden on a read-only dashboard.
ACTION_CONTROLS = (
    "#pause-controls, button.resume-key, button.cancel, #cancel, #requeue-all, #purge, "
    "button.requeue, button.discard"
)

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:20px;align-items:center}
header a{color:#cfd6e4;text-decoration:none}header a.on{color:#fff;font-weight:600}
header .ro{margin-left:auto;font-size:12px;padding:2px 8px;border-radius:9px;background:#3a4357}
main{padding:16px 20px;max-width:1100px}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{background:#fff;border-radius:8px;padding:10px 14px;
min-width:110px;box-shadow:0 1px 2px #0002}.card b{display:block;font-size:22px}
table{border-collapse:collapse;background:#fff;width:100%;margin-top:10px}
td,th{padding:5px 8px;border-bottom:1px solid #e4e7ec;text-align:left;font-size:13px}
pre{background:#fff;padding:10px;border-radius:6px;overflow:auto;max-height:360px}
button{font:inherit;padding:3px 10px;border-radius:5px;border:1px solid #99a;background:#fff;cursor:pointer}
.bar{height:8px;background:#e4e7ec;border-radius:4px;min-width:120px}.bar i{display:block;height:8px;
border-radius:4px;background:#3b82f6}.warn{color:#b42318}#msg{margin-top:8px;min-height:1.2em}
svg{background:#fff;border-radius:8px;box-shadow:0 1px 2px #0002}
"""

# Shared script: the event stream, number formatting, and POST actions.
SCRIPT = r"""
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c]));
const fmtAge = (s) => s == null ? "-" : s < 60 ? s.toFixed(1) + " s" : (s / 60).toFixed(1) + " min";
async function act(url) {
  const r = await fetch(url, {method: "POST", headers: {[CSRF_HEADER]: CSRF_TOKEN}});
  const body = await r.json();
  $("msg").textContent = r.ok ? JSON.stringify(body) : ("refused (" + r.status + "): " + body.error);
  $("msg").className = r.ok ? "" : "warn";
  if (window.refresh) window.refresh();
  return r.status;
}
async function cancelJob(id) { return act("/api/actions/cancel?id=" + encodeURIComponent(id)); }
const jobLink = (id) => `<a href="/job/${encodeURIComponent(id)}">${esc(id)}</a>`;
const cancelButton = (id) => `<button class="cancel" data-id="${esc(id)}">cancel</button>`;
function wireCancel(root) { for (const b of root.querySelectorAll("button.cancel")) b.onclick = () => cancelJob(b.dataset.id); }
const fmtProgress = (j) => j.progress == null ? "-" : (100 * j.progress).toFixed(0) + "%" +
  (j.progress_message ? " " + esc(j.progress_message) : "");
const listeners = [];
function onOverview(fn) { listeners.push(fn); }
// The header says how fresh the page is: "live" while the event stream delivers, "updated" when
// the page's own data came first, "reconnecting..." while the browser reopens a lost stream.
let streaming = false;
const stamp = (what, t) => { $("live").textContent = what + " " + new Date(t * 1000).toLocaleTimeString(); };
async function getJSON(url) {
  const r = await fetch(url); if (!r.ok) throw new Error(url + ": " + r.status);
  const body = await r.json();
  if (!streaming) stamp("updated", Date.now() / 1000);
  return body;
}
const source = new EventSource("/events");
source.addEventListener("overview", (ev) => { const d = JSON.parse(ev.data); listeners.forEach((fn) => fn(d)); });
source.onerror = () => { streaming = false; $("live").textContent = "reconnecting..."; };
onOverview((d) => { streaming = true; stamp("live", d.time); });
"""

OVERVIEW = r"""
<div class="cards">
 <div class="card">ready<b id="c-ready">-</b></div><div class="card">delayed<b id="c-delayed">-</b></div>
 <div class="card">leased<b id="c-leased">-</b></div><div class="card">done<b id="c-done">-</b></div>
 <div class="card">dead<b id="c-dead">-</b></div><div class="card">oldest ready<b id="c-oldest">-</b></div>
</div>
<p id="pause-panel">leasing: <b id="paused">-</b> <span id="paused-keys"></span>
 <span id="pause-controls"><button id="pause" onclick="act('/api/actions/pause')">pause queue</button>
 <button id="resume" onclick="act('/api/actions/resume')">resume queue</button>
 &nbsp; key <input id="pause-key" size="12" aria-label="key to pause">
 <button id="pause-key-btn" onclick="const k = $('pause-key').value; if (k) act('/api/actions/pause?key=' + encodeURIComponent(k))">pause key</button></span></p>
<h3>Throughput and errors (jobs/s, since the page opened, up to 5 minutes)</h3>
<svg id="chart" width="900" height="220" role="img" aria-label="throughput chart"></svg>
<div><span style="color:#3b82f6">&#9632; enqueued/s</span> &nbsp; <span style="color:#16a34a">&#9632; acked/s</span>
 &nbsp; <span style="color:#dc2626">&#9632; dead-lettered/s</span></div>
<h3>Limits</h3><table id="limits"><tr><th>name</th><th>running / cap</th><th>rate</th><th>next token</th></tr></table>
<h3>By priority</h3><table id="prio"><tr><th>state</th><th>priority</th><th>jobs</th></tr></table>
<script>
const points = [];
function draw() {
  const svg = $("chart"), W = 900, H = 220, P = 30;
  const series = [["enq", "#3b82f6"], ["ack", "#16a34a"], ["dead", "#dc2626"]];
  const max = Math.max(1, ...points.flatMap((p) => [p.enq, p.ack, p.dead]));
  const t1 = points.length ? points[points.length - 1].t : 0;
  const t0 = Math.max(t1 - 300, points.length ? points[0].t : 0), span = Math.max(t1 - t0, 1);
  const x = (t) => P + (W - 2 * P) * (t - t0) / span, y = (v) => H - P - (H - 2 * P) * v / max;
  let out = `<line x1="${P}" y1="${H - P}" x2="${W - P}" y2="${H - P}" stroke="#99a"/>` +
            `<text x="4" y="${P}" font-size="11">${max.toFixed(1)}</text><text x="4" y="${H - P}" font-size="11">0</text>` +
            `<text x="${W - P}" y="${H - 8}" font-size="11" text-anchor="end">now</text>` +
            `<text x="${P}" y="${H - 8}" font-size="11">${Math.round(t1 - t0)} s ago</text>`;
  for (const [k, color] of series) {
    const pts = points.filter((p) => p.t >= t0).map((p) => `${x(p.t).toFixed(1)},${y(p[k]).toFixed(1)}`).join(" ");
    if (pts) out += `<polyline fill="none" stroke="${color}" stroke-width="2" points="${pts}"/>`;
  }
  svg.innerHTML = out;
}
let prev = null;
onOverview((d) => {
  const s = d.stats;
  for (const k of ["ready", "delayed", "leased", "done", "dead"]) $("c-" + k).textContent = s[k];
  $("c-oldest").textContent = fmtAge(d.oldest_ready_age);
  $("paused").textContent = d.paused.queue ? "paused" : "running";
  $("paused").className = d.paused.queue ? "warn" : "";
  $("paused-keys").innerHTML = d.paused.keys.length ? "paused keys: " + d.paused.keys.map((k) =>
    `<span class="pkey">${esc(k)} <button class="resume-key" data-key="${esc(k)}">resume</button></span>`).join(", ") : "";
  for (const b of document.querySelectorAll("button.resume-key"))
    b.onclick = () => act("/api/actions/resume?key=" + encodeURIComponent(b.dataset.key));
  if (prev && d.time > prev.time) {
    const dt = d.time - prev.time;
    points.push({t: d.time, enq: (s.enqueued_total - prev.stats.enqueued_total) / dt,
                 ack: (s.acked_total - prev.stats.acked_total) / dt,
                 dead: (s.dead_lettered_total - prev.stats.dead_lettered_total) / dt});
    while (points.length && points[0].t < d.time - 300) points.shift();
  }
  prev = d;
  draw();
  $("limits").innerHTML = "<tr><th>name</th><th>running / cap</th><th>rate</th><th>next token</th></tr>" +
    d.limits.map((l) => `<tr><td>${esc(l.name)}</td><td>${l.concurrency ? l.running + " / " + l.concurrency : "-"}</td>` +
      `<td>${l.rate ? l.rate[0] + " per " + l.rate[1] + " s (burst " + l.burst + ")" : "-"}</td>` +
      `<td>${l.next_token_in == null ? "-" : l.next_token_in.toFixed(2) + " s"}</td></tr>`).join("");
  $("prio").innerHTML = "<tr><th>state</th><th>priority</th><th>jobs</th></tr>" +
    d.by_priority.map((r) => `<tr><td>${r.state}</td><td>${r.priority}</td><td>${r.jobs}</td></tr>`).join("");
});
</script>
"""

WAITING = r"""
<p>Jobs waiting to be leased (due and delayed), the first __LIMIT__ in enqueue order; cancelling one
means it never runs.</p>
<table id="waiting"></table>
<script>
async function refresh() {
  const rows = await getJSON("/api/list?state=ready&limit=__LIMIT__");
  const now = Date.now() / 1000;
  $("waiting").innerHTML = "<tr><th>job</th><th>key</th><th>priority</th><th>due</th><th>expires</th><th>attempts</th><th></th></tr>" +
    (rows.length ? rows.map((j) => `<tr><td>${jobLink(j.id)}</td><td>${esc(j.key ?? "-")}</td><td>${j.priority}</td>` +
      `<td>${j.available_at > now ? "in " + fmtAge(j.available_at - now) : "now"}</td>` +
      `<td>${j.expires_at == null ? "-" : "in " + fmtAge(Math.max(0, j.expires_at - now))}</td>` +
      `<td>${j.attempts}/${j.max_attempts}</td><td>${cancelButton(j.id)}</td></tr>`).join("")
      : "<tr><td colspan=7>(no job is waiting)</td></tr>");
  wireCancel($("waiting"));
}
window.refresh = refresh;
onOverview(() => refresh());
refresh();
</script>
""".replace("__LIMIT__", str(WAITING_LIMIT))

LEASES = r"""
<p>Leases held now: holder process, time left against the queue's visibility timeout (a bar longer than
the timeout was leased with a longer one, or extended by heartbeats), attempts, fencing token.</p>
<table id="leases"></table>
<script>
async function refresh() {
  const rows = await getJSON("/api/leases");
  $("leases").innerHTML = "<tr><th>job</th><th>holder</th><th>lease left</th><th>attempts</th><th>token</th><th>progress</th><th></th></tr>" +
    (rows.length ? rows.map((l) => {
      const left = Math.max(0, l.expires_in), pct = Math.min(100, 100 * left / l.visibility_timeout);
      return `<tr><td>${jobLink(l.id)}</td>` +
        `<td>${l.holder_pid ? "pid " + l.holder_pid : (l.detached ? "detached" : "-")}</td>` +
        `<td><div class="bar" title="${left.toFixed(1)} s left"><i style="width:${pct}%"></i></div>` +
        `${left.toFixed(1)} s left (timeout ${l.visibility_timeout} s)</td><td>${l.attempts}/${l.max_attempts}</td>` +
        `<td>${esc(l.lease_token)}</td><td>${fmtProgress(l)}</td>` +
        `<td>${l.cancel_requested ? "cancel requested" : cancelButton(l.id)}</td></tr>`;
    }).join("") : "<tr><td colspan=7>(no leases)</td></tr>");
  wireCancel($("leases"));
}
window.refresh = refresh;
onOverview(() => refresh());
refresh();
</script>
"""

DEAD = r"""
<p>Dead letters grouped by their last error. <button id="requeue-all" onclick="act('/api/actions/requeue')">requeue all</button>
<button id="purge" onclick="if (confirm('Remove every job of the queue?')) act('/api/actions/purge')">purge queue</button></p>
<table id="groups"></table>
<script>
async function refresh() {
  const groups = await getJSON("/api/dead-groups");
  $("groups").innerHTML = "<tr><th>error</th><th>jobs</th><th></th></tr>" + (groups.length ? groups.map((g, i) =>
    `<tr><td>${esc(g.error)}</td><td>${g.count}: ${g.ids.slice(0, 8).map((id) =>
      `<a href="/job/${encodeURIComponent(id)}">${esc(id)}</a>`).join(", ")}${g.count > 8 ? ", ..." : ""}</td>` +
    `<td><button class="requeue" data-group="${i}">requeue</button> <button class="discard" data-group="${i}">discard</button></td></tr>`
  ).join("") : "<tr><td colspan=3>(the dead-letter queue is empty)</td></tr>");
  for (const b of document.querySelectorAll("button.requeue, button.discard")) {
    b.onclick = async () => {
      const g = groups[+b.dataset.group], verb = b.className;
      const qs = g.ids.map((id) => "id=" + encodeURIComponent(id)).join("&");
      if (verb === "requeue") { for (const id of g.ids) { if (await act("/api/actions/requeue?id=" + encodeURIComponent(id)) !== 200) break; } }
      else await act("/api/actions/discard?" + qs);
    };
  }
}
window.refresh = refresh;
onOverview(() => refresh());
refresh();
</script>
"""

STORAGE = r"""
<p><button id="verify" onclick="runVerify()">verify now</button> <span id="verdict"></span></p>
<div class="cards"><div class="card">segments<b id="s-segments">-</b></div><div class="card">bytes<b id="s-bytes">-</b></div></div>
<table id="files"></table>
<script>
async function runVerify() {
  $("verdict").textContent = "verifying...";
  await getJSON("/api/verify");
  refresh();
}
async function refresh() {
  const s = await getJSON("/api/storage");
  $("s-segments").textContent = s.segments.length;
  $("s-bytes").textContent = s.bytes.toLocaleString();
  const v = s.last_verify;
  $("verdict").textContent = v ? `last verify ${new Date(v.time * 1000).toLocaleTimeString()}: ` +
    (v.ok ? `ok, ${v.records} records in ${v.segments} segments` : `${v.damage.length} problem(s)`) : "not verified since the dashboard started";
  $("verdict").className = v && !v.ok ? "warn" : "";
  $("files").innerHTML = "<tr><th>file</th><th>bytes</th></tr>" +
    s.files.map((f) => `<tr><td>${esc(f.name)}</td><td>${f.bytes.toLocaleString()}</td></tr>`).join("") +
    s.damage.map((d) => `<tr><td class="warn" colspan=2>${esc(d)}</td></tr>`).join("");
}
window.refresh = refresh;
refresh();
</script>
"""

JOB_PAGE = r"""
<div id="job">loading...</div>
<script>
const jobId = __JOB_ID__;
async function refresh() {
  const r = await fetch("/api/jobs/" + encodeURIComponent(jobId));
  const j = await r.json();
  if (!r.ok) { $("job").innerHTML = `<p class="warn">${esc(j.error)}</p>`; return; }
  if (!streaming) stamp("updated", Date.now() / 1000);
  const when = (t) => t == null ? "-" : new Date(t * 1000).toLocaleString();
  const cancellable = (j.state === "ready" || j.state === "deferred" || j.state === "leased") && !j.cancel_requested;
  const pct = j.progress == null ? null : (100 * j.progress).toFixed(0);
  $("job").innerHTML = `<h3>${esc(j.id)} ${cancellable ? '<button id="cancel">cancel</button>' : ""}</h3><table>` +
    [["state", j.state], ["cancel requested", j.cancel_requested ? "yes: its holder is told to stop" : "no"],
     ["key", j.key ?? "-"], ["attempts", j.attempts + " / " + j.max_attempts],
     ["priority", j.priority], ["enqueued", when(j.enqueued_at)], ["available at", when(j.available_at)],
     ["expires at", when(j.expires_at)], ["lease deadline", when(j.lease_deadline)],
     ["fencing token", j.lease_token ?? "-"], ["last error", j.last_error ?? "-"]]
    .map(([k, v]) => `<tr><th>${k}</th><td>${esc(v)}</td></tr>`).join("") +
    [["parents", "parents", j.depends_on], ["dependents", "dependents", j.dependents]]
    .map(([k, id, ids]) => `<tr><th>${k}</th><td id="${id}">${ids && ids.length ? ids.map(jobLink).join(", ") : "-"}</td></tr>`).join("") +
    `<tr><th>progress</th><td id="progress">${pct == null ? "-" : `<div class="bar"><i style="width:${pct}%"></i></div>` +
      `${pct}%${j.progress_message ? " " + esc(j.progress_message) : ""}`}</td></tr>` +
    `</table><h4>payload</h4><pre id="payload">${esc(j.payload_preview)}</pre>` +
    (j.result_preview == null ? "" : `<h4>result</h4><pre id="result">${esc(j.result_preview)}</pre>`);
  if (cancellable) $("cancel").onclick = () => cancelJob(j.id);
}
window.refresh = refresh;
onOverview(() => refresh());
refresh();
</script>
"""

PAGES = {
    "overview": OVERVIEW,
    "waiting": WAITING,
    "leases": LEASES,
    "dead": DEAD,
    "search": search_page.PAGE,
    "storage": STORAGE,
}


def _layout(current: str, body: str, st: _State) -> str:
    nav = "".join(
        f'<a href="/page/{p}" class="{"on" if p == current else ""}">{t}</a>' for p, t in NAV
    )
    mode = "actions allowed" if st.allow_actions else "read-only"
    # A read-only dashboard shows no control it would refuse (the POSTs still answer 403).
    hide = "" if st.allow_actions else f"<style>{ACTION_CONTROLS}{{display:none}}</style>"
    title = html.escape(f"ringq: {st.queue.name}")
    consts = f"const CSRF_HEADER = {json.dumps(CSRF_HEADER)}, CSRF_TOKEN = {json.dumps(st.token)};"
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{STYLE}</style>{hide}</head><body><header><strong>{title}</strong>{nav}"
        f'<span id="live">connecting...</span><span class="ro" id="mode">{mode}</span></header>'
        f'<main><div id="msg"></div><script>{consts}{SCRIPT}</script>{body}</main></body></html>'
    )
