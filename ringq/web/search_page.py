"""The dashboard's search: a page that finds jobs by id, state, key, priority and error text, a
page of results at a time (``Queue.search``), and the query string its API takes.

``/api/search?state=S&key=K&priority=P&id=ID&error=TEXT&after=CURSOR&limit=N`` answers
``{"jobs": [Job.to_dict(), ...], "total": matches, "next": cursor or null}``; the same query as
``ringq list --state S --key K --priority P --id ID --error TEXT --json`` (which prints the jobs).
"""

from __future__ import annotations

from typing import Any

from ringq.backend import SEARCH_STATES

__all__ = ["PAGE", "PAGE_SIZE", "query_of"]

PAGE_SIZE = 50  # jobs per page of results (``limit`` may ask for 1..500)
MAX_PAGE = 500


def query_of(params: Any) -> dict[str, Any]:
    """``Queue.search`` keyword arguments from a request's query parameters.  Raises ValueError
    (the API answers 400) for an unknown state, a priority or limit that is not an integer."""
    out: dict[str, Any] = {}
    for name, arg in (("state", "state"), ("key", "key"), ("id", "job_id"), ("error", "error")):
        v = params.get(name)
        if v:
            out[arg] = v
    if out.get("state") is not None and out["state"] not in SEARCH_STATES:
        raise ValueError(f"unknown state {out['state']!r}")
    for name in ("priority", "limit"):
        v = params.get(name)
        if v not in (None, ""):
            try:
                out[name] = int(v)
            except ValueError:
                raise ValueError(f"{name} must be an integer, got {v!r}") from None
    out["limit"] = min(max(1, out.get("limit", PAGE_SIZE)), MAX_PAGE)
    if params.get("after"):
        out["after"] = params.get("after")
    return out


PAGE = (
    r"""
<form id="search-form" onsubmit="event.preventDefault(); runSearch(null);">
 id <input id="q-id" size="18" aria-label="job id">
 state <select id="q-state" aria-label="state"><option value="">any</option>__STATES__</select>
 key <input id="q-key" size="10" aria-label="key">
 priority <input id="q-priority" size="4" aria-label="priority">
 error contains <input id="q-error" size="20" aria-label="error text">
 <button id="q-go" type="submit">search</button>
</form>
<p id="q-summary"></p>
<table id="results"></table>
<p><button id="q-first" style="display:none" onclick="runSearch(null)">first page</button>
 <button id="q-next" style="display:none">next page</button></p>
<script>
async function runSearch(after) {
  const qs = new URLSearchParams();
  for (const [k, id] of [["id", "q-id"], ["state", "q-state"], ["key", "q-key"], ["priority", "q-priority"], ["error", "q-error"]]) {
    const v = $(id).value.trim(); if (v) qs.set(k, v);
  }
  if (after) qs.set("after", after);
  const r = await fetch("/api/search?" + qs.toString());
  const d = await r.json();
  if (!r.ok) { $("q-summary").textContent = d.error; $("q-summary").className = "warn"; return; }
  $("q-summary").className = "";
  $("q-summary").textContent = `${d.total} matching job${d.total === 1 ? "" : "s"}` + (d.jobs.length ? `, showing ${d.jobs.length}` : "");
  $("results").innerHTML = "<tr><th>job</th><th>state</th><th>key</th><th>priority</th><th>attempts</th><th>last error</th></tr>" +
    d.jobs.map((j) => `<tr><td>${jobLink(j.id)}</td><td>${esc(j.state)}</td><td>${esc(j.key ?? "-")}</td>` +
      `<td>${j.priority}</td><td>${j.attempts}/${j.max_attempts}</td><td>${esc(j.last_error ?? "-")}</td></tr>`).join("");
  $("q-next").style.display = d.next ? "" : "none";
  $("q-next").onclick = () => runSearch(d.next);
  $("q-first").style.display = after ? "" : "none";
}
runSearch(null);
</script>
"""
).replace("__STATES__", "".join(f'<option value="{s}">{s}</option>' for s in SEARCH_STATES))
