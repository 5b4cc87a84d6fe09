# Controller-side filters of history.yml's report (docs/report.md): the model of a host's page
# (its drops kept under verify's own noise band, the verify verdict, the current goodput), and
# the self-contained HTML pages of a host and of a job, with matplotlib's figures inlined as
# SVG, so that a page needs no network and no other file to be read.
from __future__ import annotations

import html
import io
import json
import re
from datetime import UTC, datetime
from typing import Any

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lines import DEPLOY_ACTIONS
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import deployment_index
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_throughput import band

# More deployments than this on one figure and only the drops are labelled with their release.
LABEL_ALL = 30
# The stage figure shows the newest deployments with stage times (a bar each stays readable).
STAGE_BARS = 40
# Identifiers in the SVG that tests and other tools read the figure by (docs/report.md).
POINTS_GID = "dflash-points"


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


def _time(value: Any) -> float | None:
    """An ISO time as matplotlib's date number (annotations in axes coordinates take no
    datetime); None for a missing or unreadable time (the line is then only in the table)."""
    from matplotlib.dates import date2num

    try:
        return float(date2num(datetime.fromisoformat(str(value))))
    except ValueError:
        return None


def report_model(
    data: dict | None,
    host: str,
    min_ratio: float = 0.8,
    verify: dict | None = None,
    verify_time: float | None = None,
) -> dict:
    """A host's report as data (reports/report.json): the dflash_report module's answer with
    the drops verify's band keeps (each with its `band`), the verify verdict of the host
    (verify.json, written at `verify_time`, a unix time), the current deployment and its
    goodput; `error` when the host gave none."""
    host_verify = ((verify or {}).get("hosts") or {}).get(host)
    if host_verify and verify_time is not None:
        judged = datetime.fromtimestamp(verify_time, UTC).isoformat(timespec="seconds")
        host_verify = dict(host_verify, written=judged)
    if not data or data.get("failed") or "deployments" not in data:
        why = (data or {}).get("msg") or "the host did not answer (unreachable or failed)"
        return {"host": host, "error": why, "current": None, "current_number": None,
                "goodput": None, "deployments": [], "drops": [], "damaged": [],
                "verify": host_verify, "min_ratio": min_ratio}  # fmt: skip
    rows = data["deployments"]
    drops = []
    for drop in data.get("drops") or []:
        limit = band(min_ratio, {"step_spread": drop.get("reference_step_spread")})
        if drop["ratio"] < limit:
            drops.append(dict(drop, band=limit))
    now = deployment_index(rows, data.get("current"))
    return {
        "host": host,
        "error": None,
        "current": data.get("current"),
        "current_number": None if now is None else rows[now]["number"],
        "goodput": None if now is None else rows[now].get("goodput"),
        "deployments": rows,
        "drops": drops,
        "damaged": data.get("damaged") or [],
        "verify": host_verify,
        "min_ratio": min_ratio,
    }


def report_models(
    results: dict[str, dict | None],
    min_ratio: float = 0.8,
    verify: dict | None = None,
    verify_time: float | None = None,
) -> dict[str, dict]:
    """{host: its report_model} of every host of the play (None: it did not answer)."""
    return {
        host: report_model(data, host, min_ratio, verify, verify_time)
        for host, data in results.items()
    }


def report_jobs(models: dict[str, dict], jobs: dict[str, str | None]) -> dict[str, dict]:
    """{job: {host: model}} of the hosts that train as one job (`jobs`: each host's dflash_job,
    empty for a host of its own)."""
    found: dict[str, dict] = {}
    for host, model in models.items():
        if jobs.get(host):
            found.setdefault(str(jobs[host]), {})[host] = model
    return found


# --- figures ---------------------------------------------------------------------------------


def _svg(figure: Any) -> str:
    """A matplotlib figure as an inline <svg> element: text kept as text, stable ids."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _figure(width: float, height: float) -> Any:
    # matplotlib is imported only when a page is drawn: every playbook loads this file's
    # filters, and pyplot's global state is not needed (a Figure draws itself).
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _rc() -> Any:
    import matplotlib

    return matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dflash-report",
                                  "font.size": 9})  # fmt: skip


def _is_point(row: dict) -> bool:
    """A line that deployed something (a deploy or rollback): a point of the figure."""
    return row.get("action", "deploy") in DEPLOY_ACTIONS


def _plot_host(ax: Any, model: dict, label: str | None, color: str | None) -> None:
    """One host's runs, deployments, drops and restarts on the tokens/s axes."""
    rows = model["deployments"]
    drops = {drop["number"] for drop in model["drops"]}
    # Ids of the figure's groups: a job's page draws several hosts, each id once.
    tag = f"-{label}" if label else ""
    prefix = POINTS_GID + tag
    for row in rows:
        steps = [(_time(p["time"]), p["tokens_per_s"]) for p in row.get("series") or []]
        steps = [(t, v) for t, v in steps if t is not None]
        if steps:
            ax.plot(*zip(*steps, strict=True), lw=0.8, alpha=0.45, color=color or "tab:blue",
                    gid=f"dflash-run{tag}-{row['number']}")  # fmt: skip
    points = [r for r in rows if _is_point(r) and _time(r.get("time"))]
    kinds = {
        "deploy": ("o", "deployment (health check)"),
        "rollback": ("s", "rollback (health check)"),
    }
    for action, (marker, name) in kinds.items():
        rated = [r for r in points if r.get("action", "deploy") == action
                 and _number(r.get("tokens_per_s"))]  # fmt: skip
        if rated:
            ax.plot([_time(r["time"]) for r in rated], [r["tokens_per_s"] for r in rated],
                    ls="none", marker=marker, ms=6, color=color,
                    label=f"{label}: {name}" if label else name,
                    gid=f"{prefix}-{action}")  # fmt: skip
    unrated = [r for r in points if not _number(r.get("tokens_per_s"))]
    if unrated:
        # Not a zero: no figure was measured (failed, rolled back, staged), so these sit on a
        # strip under the axis, in axes coordinates.
        ax.plot([_time(r["time"]) for r in unrated], [0.03] * len(unrated), ls="none",
                marker="x", ms=7, color="tab:gray", transform=ax.get_xaxis_transform(),
                label=f"{label + ': ' if label else ''}no tokens/s (failed, rolled back, staged)",
                gid=f"{prefix}-unrated")  # fmt: skip
    dropped = [r for r in points if r["number"] in drops]
    if dropped:
        ax.plot([_time(r["time"]) for r in dropped], [r["tokens_per_s"] for r in dropped],
                ls="none", marker="o", ms=13, mfc="none", mec="tab:red", mew=2,
                label=f"{label + ': ' if label else ''}drop beyond the noise band",
                gid=f"dflash-drops{tag}")  # fmt: skip
    restarts = [_time(r.get("time")) for r in rows if r.get("action") == "restart"]
    restarts = [t for t in restarts if t is not None]
    if restarts:
        ax.vlines(restarts, 0, 1, transform=ax.get_xaxis_transform(), colors="tab:orange",
                  linestyles="dashed", lw=1, label="supervisor restart",
                  gid=f"dflash-restarts{tag}")  # fmt: skip
    for row in points:
        if len(points) <= LABEL_ALL or row["number"] in drops:
            speed = _number(row.get("tokens_per_s"))
            text = f"#{row['number']} {row.get('release')}"
            if row.get("action") == "rollback":
                text += " (rollback)"
            if speed is None:
                ax.annotate(text, (_time(row["time"]), 0.03), xycoords=ax.get_xaxis_transform(),
                            xytext=(4, 6), textcoords="offset points", fontsize=7,
                            color="tab:gray")  # fmt: skip
            else:
                ax.annotate(text, (_time(row["time"]), speed), xytext=(4, 6),
                            textcoords="offset points", fontsize=7)  # fmt: skip


# Label offsets tried, in points above (+) or below (-) the first place, until one is free.
LABEL_SHIFTS = (0, 10, -10, 20, -20, 30, -30, 40, -40, 50)


def _laid_out(figure: Any) -> Any:
    """The renderer of `figure`, laid out as the page will be (its text extents are final)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not hasattr(figure.canvas, "get_renderer"):
        FigureCanvasAgg(figure)
    figure.draw_without_rendering()
    return figure.canvas.get_renderer()


def label_boxes(figure: Any, ax: Any) -> list[Any]:
    """The drawn extent of each point label of `ax`."""
    renderer = _laid_out(figure)
    return [text.get_window_extent(renderer) for text in ax.texts]


def spread_labels(figure: Any, ax: Any) -> None:
    """Move each point label (in time order) up or down until it overlaps none placed before
    it: deployments close in time and speed would print their labels over each other."""
    renderer = _laid_out(figure)
    placed: list[Any] = []
    for text in sorted(ax.texts, key=lambda t: t.xy[0]):
        x, y = text.xyann
        for shift in LABEL_SHIFTS:
            text.xyann = (x, y + shift)
            box = text.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
        placed.append(box)


def throughput_figure(models: dict[str, dict]) -> str:
    """tokens/s over time: each run's logged steps as a line, each deployment a point at its
    health check labelled with its release, drops ringed, restarts as dashed lines."""
    with _rc():
        figure = _figure(11, 4.2)
        ax = figure.add_subplot()
        several = len(models) > 1
        colors = ["tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
        for position, (host, model) in enumerate(sorted(models.items())):
            _plot_host(ax, model, host if several else None,
                       colors[position % len(colors)] if several else None)  # fmt: skip
        ax.xaxis_date()
        ax.set_ylim(bottom=0)
        ax.set_ylabel("tokens/s")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
        figure.autofmt_xdate()
        spread_labels(figure, ax)
        return _svg(figure)


def stages_figure(model: dict) -> str | None:
    """Seconds per step by stage at each deployment's health check (the newest STAGE_BARS),
    stacked, with the time outside every timed stage on top: a slower stage stands out."""
    rows = [r for r in model["deployments"] if r.get("stages")][-STAGE_BARS:]
    if not rows:
        return None
    names: list[str] = []
    for row in rows:
        names += [k for k in row["stages"] if k != "step" and k not in names]
    with _rc():
        figure = _figure(11, 3.4)
        ax = figure.add_subplot()
        labels = [f"#{r['number']} {r.get('release')}" for r in rows]
        bottom = [0.0] * len(rows)
        for name in names:
            values = [float(r["stages"].get(name) or 0) for r in rows]
            ax.bar(labels, values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        other = [max(0.0, float(r["stages"].get("step") or 0) - b)
                 for r, b in zip(rows, bottom, strict=True)]  # fmt: skip
        if any(other):
            ax.bar(labels, other, bottom=bottom, label="outside the timed stages",
                   color="lightgray")  # fmt: skip
        ax.set_ylabel("seconds per step")
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        return _svg(figure)


# --- pages -----------------------------------------------------------------------------------

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;
color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px}td,th{padding:2px 8px;border-bottom:1px solid #eee;
text-align:left;vertical-align:top}
.num{text-align:right}.bad{color:#b00}.muted{color:#777}.stale{color:#b00}
.verdict{display:inline-block;padding:1px 8px;border-radius:4px;color:#fff;background:#777}
.verdict.ok{background:#2a7}.verdict.drift,.verdict.broken,.verdict.unreachable{background:#c33}
svg{max-width:100%;height:auto}pre{background:#f6f6f6;padding:6px;overflow-x:auto;font-size:12px}
.drop{border-left:4px solid #c33;padding:0 0 0 10px;margin:1em 0}
code{background:#f2f2f2;padding:0 3px}
"""


def _e(value: Any) -> str:
    return html.escape("-" if value is None else str(value))


def _speed(value: Any) -> str:
    speed = _number(value)
    return f"{speed:,.0f}" if speed is not None else "-"


def _anchor(*parts: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(str(p) for p in parts)).strip("-")


def _page(title: str, body: list[str], model: Any) -> str:
    data = json.dumps(model, sort_keys=True, default=str).replace("</", "<\\/")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>", *body,
        # The page's data for other tools and tests, never run as a script.
        f'<script type="application/json" id="dflash-report-data">{data}</script>',
        "</body></html>",
    ])  # fmt: skip


def _change_text(change: dict) -> str:
    return f"{change['name']} {_plain(change['from'])} -> {_plain(change['to'])}"


def _plain(value: Any) -> str:
    if value is None:
        return "(none)"
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


# The sections of diff.yml's changes under the names a reader looks for.
SECTIONS = {"environment": "env pins", "layout": "GPU layout", "data": "data",
            "release": "release"}  # fmt: skip


def _grouped(changes: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for change in changes:
        section = change["section"]
        if section == "run_sh":
            name = "trainer flags" if change["name"].startswith("trainer_args.") else "run.sh"
        else:
            name = SECTIONS.get(section, section)
        groups.setdefault(name, []).append(change)
    return groups


def _cache_word(row: dict | None) -> str | None:
    cache = (row or {}).get("compile_cache") or {}
    if cache.get("started_warm") is None:
        return None
    return "warm" if cache["started_warm"] else "cold"


def _diff_block(side: dict, rows: dict[int, dict], anchor: str, heading: str) -> list[str]:
    """One side of a drop: every change as a list item, files linked to their text diffs."""
    files = side["files"]
    out = [f"<h4>{heading}</h4>", '<ul class="changes">']
    if not files["known"]:
        out.append("<li class='muted'>code files: unknown (a release is no longer on the "
                   "target, or was rebuilt)</li>")  # fmt: skip
    for kind in ("changed", "added", "removed"):
        for path in files[kind]:
            link = _anchor(anchor, path)
            has_text = path in files.get("text", {})
            name = f'<a href="#{link}">{_e(path)}</a>' if has_text else _e(path)
            out.append(f"<li>code file {kind}: {name}</li>")
    for group, items in _grouped(side["changes"]).items():
        for change in items:
            out.append(f"<li>{_e(group)}: <code>{_e(_change_text(change))}</code></li>")
    old, new = rows.get(side["from"]["number"]), rows.get(side["to"]["number"])
    if _cache_word(old) != _cache_word(new):
        out.append(f"<li>compile cache: <code>{_e(_cache_word(old))} -> "
                   f"{_e(_cache_word(new))}</code></li>")  # fmt: skip
    # Only what was so before the slower health check can explain it: the supervisor's
    # restarts of either run came after that run's health check (the table counts them).
    out.append("</ul>")
    for path, text in sorted(files.get("text", {}).items()):
        # The id on the text, inside the closed <details>: a browser opens it when a link
        # leads there (scroll to fragment), with no script on the page.
        out.append(f"<details><summary>diff of {_e(path)}</summary>"
                   f'<pre id="{_anchor(anchor, path)}">{_e(text)}</pre></details>')  # fmt: skip
    if side.get("run_sh_text"):
        out.append(f"<details><summary>diff of run.sh</summary><pre>{_e(side['run_sh_text'])}"
                   "</pre></details>")  # fmt: skip
    return out


def _drops(model: dict) -> list[str]:
    rows = {row["number"]: row for row in model["deployments"]}
    out = ['<h2 id="drops">Drops beyond the noise band</h2>']
    if not model["drops"]:
        out.append("<p class='muted'>No deployment ran slower than the comparable one before it "
                   "by more than verify's band.</p>")  # fmt: skip
    for drop in model["drops"]:
        new, ref = rows[drop["number"]], rows[drop["reference"]]
        anchor = f"drop-{drop['number']}"
        out += [
            f'<section class="drop" id="{anchor}" data-number="{drop["number"]}">',
            f"<h3>#{drop['number']} {_e(new.get('release'))} ({_e(new.get('time'))}): "
            f"{_speed(new.get('tokens_per_s'))} tokens/s, x{drop['ratio']:g} of "
            f"#{ref['number']} {_e(ref.get('release'))} ({_speed(ref.get('tokens_per_s'))}; "
            f"band x{drop['band']:g})</h3>",
            *_diff_block(drop["previous"], rows, f"{anchor}-previous",
                         f"What changed from #{ref['number']} {_e(ref.get('release'))} "
                         "(the comparable deployment before)"),
        ]  # fmt: skip
        if drop.get("fastest"):
            fast = rows[drop["fastest"]["from"]["number"]]
            out += _diff_block(drop["fastest"], rows, f"{anchor}-fastest",
                               f"What changed from #{fast['number']} {_e(fast.get('release'))} "
                               f"(the fastest comparable, {_speed(fast.get('tokens_per_s'))} "
                               "tokens/s)")  # fmt: skip
        out.append("</section>")
    return out


def _deployed_since(model: dict, written: object) -> list[str]:
    """`#N release` of each deployment or rollback made after verify's report was written."""
    then = _time(written) if written else None
    if then is None:
        return []
    return [f"#{r['number']} {r.get('release')}" for r in model["deployments"]
            if _is_point(r) and (_time(r.get("time")) or 0) > then]  # fmt: skip


def _verify(model: dict) -> list[str]:
    out = ['<h2 id="verify">Verify</h2>']
    found = model.get("verify")
    if not found:
        return [*out, "<p class='muted'>No verify.yml report of this host (reports/verify.json): "
                "run <code>ansible-playbook verify.yml</code> first.</p>"]  # fmt: skip
    verdict = found.get("verdict") or "-"
    when = f", judged {_e(found['written'])}" if found.get("written") else ""
    out.append(f"<p>Verdict of the last verify.yml: <span class='verdict {_e(verdict)}'>"
               f"{_e(verdict)}</span> (release {_e(found.get('release'))}{when})</p>")  # fmt: skip
    later = _deployed_since(model, found.get("written"))
    if later:
        out.append(f"<p class='stale'><b>Stale</b>: {len(later)} deployment"
                   f"{'s' if len(later) > 1 else ''} since this verdict "
                   f"({_e(', '.join(later))}); it judged what ran before them. Run "
                   "<code>ansible-playbook verify.yml</code> again.</p>")  # fmt: skip
    findings = found.get("findings") or []
    if findings:
        out.append("<table><tr><th>kind</th><th>expected</th><th>found</th><th>hint</th></tr>")
        out += [f"<tr><td>{_e(f.get('kind'))}</td><td>{_e(f.get('expected'))}</td>"
                f"<td>{_e(f.get('found'))}</td><td>{_e(f.get('hint'))}</td></tr>"
                for f in findings]  # fmt: skip
        out.append("</table>")
    for name, text in (found.get("checks") or {}).items():
        out.append(f"<p class='muted'>check {_e(name)}: {_e(text)}</p>")
    return out


def _goodput(value: dict | None) -> str:
    ratio = (value or {}).get("ratio")
    return "-" if ratio is None else f"{ratio * 100:.1f}%"


def _result(row: dict) -> str:
    text = _e(row.get("result"))
    if row.get("action") == "restart":
        text += f" ({_e(row.get('reason'))})"
    if row.get("rolled_back_to"):
        text += f" -> {_e(row['rolled_back_to'])}"
    return text


def _table(model: dict) -> list[str]:
    out = ['<h2 id="deployments">Every line of history.jsonl</h2>',
           "<table><tr><th>#</th><th>time</th><th>action</th><th>release</th><th>result</th>"
           "<th class='num'>tokens/s</th><th>goodput</th><th>restarts</th>"
           "<th>compile cache</th><th>layout</th></tr>"]  # fmt: skip
    drops = {drop["number"] for drop in model["drops"]}
    for row in model["deployments"]:
        speed = _number(row.get("tokens_per_s"))
        # A line without a figure says so; it is never drawn or listed as zero.
        shown = (
            _speed(speed)
            if speed is not None
            else ("<span class='muted'>no tokens/s</span>" if _is_point(row) else "")
        )
        number = row["number"]
        cells = [
            f'<a href="#drop-{number}">{number}</a>' if number in drops else str(number),
            _e(row.get("time")), _e(row.get("action")), _e(row.get("release")), _result(row),
            shown, _goodput(row.get("goodput")), _e(row.get("restarts")),
            _e(_cache_word(row)), _e((row.get("layout") or {}).get("mode")),
        ]  # fmt: skip
        kind = " class='bad'" if number in drops else ""
        out.append(f"<tr{kind} data-number='{number}'>"
                   + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")  # fmt: skip
    out.append("</table>")
    return out


def _damaged(model: dict) -> list[str]:
    if not model["damaged"]:
        return []
    out = ['<h2 id="damaged" class="bad">Damaged lines of history.jsonl</h2><ul>']
    out += [f"<li>line {item['line']} ({item['bytes']} bytes): not a JSON record, skipped: "
            f"<code>{_e(item['text'])}</code></li>" for item in model["damaged"]]  # fmt: skip
    return [*out, "</ul>"]


def report_html(model: dict) -> str:
    """A host's page: tokens/s across its deployments, the drops and what changed, verify's
    verdict, goodput, stage times and every history line."""
    host = model["host"]
    head = [f"<h1>dflash report: {_e(host)}</h1>"]
    if model.get("error"):
        return _page(f"dflash report {host}", [*head, f"<p class='bad'>{_e(model['error'])}</p>",
                                               *_verify(model)], model)  # fmt: skip
    current = model.get("current")
    head.append(f"<p>current: <b>{_e(current)}</b> (#{_e(model.get('current_number'))}); "
                f"goodput of its run: <b>{_goodput(model.get('goodput'))}</b>; "
                f"{len(model['deployments'])} history lines, {len(model['drops'])} drop(s); "
                f"drop band: verify's (x{model['min_ratio']:g}, lowered by the reference's step "
                "spread)</p>")  # fmt: skip
    stages = stages_figure(model)
    body = [
        *head, *_damaged(model),
        '<h2 id="throughput">tokens/s</h2>', throughput_figure({host: model}),
        *_drops(model), *_verify(model),
        '<h2 id="stages">Stage times at each health check</h2>',
        stages or "<p class='muted'>No stage times recorded.</p>",
        *_table(model),
    ]  # fmt: skip
    return _page(f"dflash report {host}", body, model)


def report_file(name: str, job: bool = False) -> str:
    """The page's file name under the reports folder: report-<host>.html, report-job-<job>.html
    (a name's characters other than letters, digits, _ and - as -)."""
    return f"report-{'job-' if job else ''}{_anchor(name) or 'host'}.html"


def job_report_html(models: dict[str, dict], job: str, verify: dict | None = None) -> str:
    """A job's page: tokens/s of every host of the job on one axis, and a row per host with
    its current release, verdict, goodput and drops, linked to the host's page."""
    job_verify = ((verify or {}).get("jobs") or {}).get(job) or {}
    answered = {h: m for h, m in models.items() if not m.get("error")}
    body = [f"<h1>dflash report: job {_e(job)}</h1>"]
    if job_verify:
        verdict = job_verify.get("verdict") or "-"
        body.append(f"<p>Verdict of the last verify.yml: <span class='verdict {_e(verdict)}'>"
                    f"{_e(verdict)}</span></p>")  # fmt: skip
    body += ["<h2>Hosts</h2>", "<table><tr><th>host</th><th>current</th><th>verdict</th>"
             "<th>goodput</th><th>drops</th><th class='num'>deployments</th></tr>"]  # fmt: skip
    for host, model in sorted(models.items()):
        verdict = (model.get("verify") or {}).get("verdict")
        body.append(
            f"<tr class='host' data-host='{_e(host)}'><td><a href='{report_file(host)}'>"
            f"{_e(host)}</a></td><td>{_e(model.get('current') or model.get('error'))}</td>"
            f"<td>{_e(verdict)}</td><td>{_goodput(model.get('goodput'))}</td>"
            f"<td>{len(model['drops'])}</td><td class='num'>{len(model['deployments'])}</td></tr>"
        )
    body.append("</table>")
    if answered:
        body += ["<h2>tokens/s</h2>", throughput_figure(answered)]
    return _page(f"dflash report job {job}", body, {"job": job, "hosts": models})


class FilterModule:
    def filters(self) -> dict:
        return {
            "dflash_report_model": report_model,
            "dflash_report_models": report_models,
            "dflash_report_jobs": report_jobs,
            "dflash_report_html": report_html,
            "dflash_report_job_html": job_report_html,
            "dflash_report_file": report_file,
        }
