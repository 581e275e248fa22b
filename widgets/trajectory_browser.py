"""TrajectoryBrowser: a run's steps, a page of its episodes, and one episode's call tree token by token.

    browser = TrajectoryBrowser(run_dir)       # in a notebook cell (after pn.extension()), or served
    browser.search = "Wrong"; browser.role = "verifier1"; browser.next_page(); browser.open_episode(12)

Steps → episodes (paginated on the server: ``page_size`` a page, Prev/Next and the total; filtered by
role, episode reward range, format failures and text in prompts or completions) → the call tree of the
chosen episode: nested cards by parent call, each with role, policy and version, rewards, advantage,
format error, parsed output, tool calls with their results, and its tokens coloured by owner, logprob
or advantage (``widgets.token_view``). Only the current page and the open episode are read from the
store (``workbench.store.queries``); a card's tokens are read when it is first expanded (the first
top-level call opens expanded, the others collapsed; with a role filter, the calls of that role and
the cards around them open, marked ``wb-role-match``). ``show_role(role)`` filters by a role and opens
the first such episode (what a click on a node of the run's graph does). Until a step is chosen, the
browser shows the newest step that has episodes (not a finished run's evaluation-only last step).
``refresh()`` re-reads the steps and the page (a run being written shows its new steps); ``live=True``
refreshes every ``interval_ms`` while shown.

Given a ``widgets.replay_form.ReplayForm`` (``replay=``; the dashboard gives one to operators), the open
episode shows it, offering the episode's calls: expanding a card picks that call (with a role filter, the
first call of that role is picked).

Stable hooks for browser tests (CSS classes; widgets' labels in brackets):
``wb-browser`` the whole view · ``wb-run-header`` the run's id, model and status (``data-run``) ·
``wb-steps`` the step selector ["Step"] · ``wb-filter-role`` ["Role"], ``wb-filter-min-reward``
["Min reward"], ``wb-filter-max-reward`` ["Max reward"], ``wb-filter-format`` ["Format failures only"],
``wb-filter-search`` ["Search text"] · ``wb-colour-by`` the colouring switch · ``wb-refresh`` ·
``wb-episodes`` the episode table (Bokeh's DataTable: ``.slick-row`` rows, rendered as they scroll
into view; each row's first cell holds ``<span class="wb-episode" data-episode=ID>``; click a row to
open it) · ``wb-prev``, ``wb-next`` and
``wb-page`` ("page i of n · N episodes", with ``data-page``, ``data-pages``, ``data-total``) ·
``wb-tree`` the open episode (``wb-episode-header`` with ``data-episode``) · ``wb-call`` a call's
card (plus ``wb-depth-D``; header ``<span class="wb-call-title" data-call=ID data-role=ROLE>``;
collapsed cards expand on a click on their ``.card-header``) · ``wb-call-fields`` its fields ·
tokens as in ``widgets.token_view``: ``.wb-tokens`` holding ``span.tok[data-owner]`` · the replay form's as in ``widgets.replay_form``.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import panel as pn
import param
from bokeh.models.widgets.tables import HTMLTemplateFormatter

from widgets.live import PeriodicRefresh
from widgets.replay_form import ReplayForm
from widgets.token_text import CallTokens, call_tokens, run_model
from widgets.token_view import COLOURINGS, tokens_html
from workbench.store import RunReader
from workbench.store import queries as q

_esc = html.escape
#: Height of the episode table in pixels (it scrolls beyond), and of one of its rows.
TABLE_HEIGHT, ROW_HEIGHT = 380, 28
#: Characters of a JSON field (parsed output, tool arguments and results) shown before "…".
JSON_CHARS = 4000
_ANY_ROLE = "(any role)"
_ALL_STEPS = -1
#: The episode cell: the id, in a span a browser test can find (the value is an int: nothing to escape).
_EPISODE_CELL = '<span class="wb-episode" data-episode="<%= value %>"><%= value %></span>'
#: The episode table's columns and their relative widths.
_TABLE_WIDTHS = {
    "episode": 60, "step": 45, "task_id": 110, "group_key": 70, "status": 70, "reward": 60, "calls": 45,
    "format_errors": 85, "roles": 200, "error": 160,
}  # fmt: skip
_TABLE_COLUMNS = list(_TABLE_WIDTHS)


@dataclass
class _OpenCall:
    """A call card of the open episode, with its token pane (filled on first expansion)."""

    node: q.StoredCall
    card: pn.Card
    tokens: pn.pane.HTML
    detail: CallTokens | None = None


def _json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, indent=1, default=str)
    return (
        text
        if len(text) <= JSON_CHARS
        else text[:JSON_CHARS] + f" … ({len(text) - JSON_CHARS} more characters)"
    )


def _pre(value: Any) -> str:
    return (
        f'<pre style="margin:0;max-height:16em;overflow:auto;white-space:pre-wrap">{_esc(_json(value))}</pre>'
    )


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [] if value is None else [value]


def _number(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


def call_fields_html(node: q.StoredCall) -> str:
    """A call's fields (everything but its tokens) as an escaped HTML definition list."""
    version = "—" if node.policy_version is None else str(node.policy_version)
    fields = {
        "policy": f"{_esc(node.policy or '—')} (version {version})",
        "rewards": _esc(", ".join(f"{k} {_number(v)}" for k, v in (node.rewards or {}).items()) or "—"),
        "advantage": _number(node.advantage),
        "tokens": f"{node.n_prompt or 0} prompt · {node.n_completion or 0} completion",
    }
    if node.format_error:
        fields["format error"] = (
            f'<span class="wb-format-error" style="color:#b00020">{_esc(node.format_error)}</span>'
        )
    if node.source_id is not None:
        fields["consumed"] = f"call {node.source_id}"
    if isinstance(node.timings, dict) and node.timings.get("finish_reason"):
        fields["finish"] = _esc(str(node.timings["finish_reason"]))
    if node.action not in (None, "", {}, []):
        fields["parsed"] = _pre(node.action)
    calls, results = _as_list(node.tool_calls), _as_list(node.tool_results)
    for i in range(max(len(calls), len(results))):
        call = calls[i] if i < len(calls) else None
        name = call.get("name", "?") if isinstance(call, dict) else "?"
        arguments = call.get("arguments") if isinstance(call, dict) else call
        body = f'<div class="wb-tool-call">{_pre(arguments)}</div>'
        if i < len(results):
            body += f'<div class="wb-tool-result">→ {_pre(results[i])}</div>'
        fields[f"tool call {i + 1}: {_esc(str(name))}"] = body
    items = "".join(
        f"<dt style='font-weight:600'>{k}</dt><dd style='margin:0'>{v}</dd>" for k, v in fields.items()
    )
    return (
        f'<dl class="wb-call-fields" data-call="{node.id}" '
        f'style="display:grid;grid-template-columns:9em 1fr;gap:2px 8px;margin:0">{items}</dl>'
    )


def call_title_html(node: q.StoredCall) -> str:
    """A call card's header: role, call id, rewards, advantage and a format-error mark."""
    bits = [f"call {node.id}"]
    if node.rewards:
        bits.append(", ".join(f"{k} {_number(v)}" for k, v in node.rewards.items()))
    if node.advantage is not None:
        bits.append(f"adv {node.advantage:+.3f}")
    if node.format_error:
        bits.append("⚠ format")
    preview = node.preview.replace("\n", " ")
    preview = preview[:60] + ("…" if len(preview) > 60 else "")
    return (
        f'<div style="text-align:left"><span class="wb-call-title" data-call="{node.id}" '
        f'data-role="{_esc(node.role)}"><b>{_esc(node.role)}</b> · {_esc(" · ".join(bits))}</span>'
        f' <span class="wb-call-preview" style="color:#777;font-family:monospace">{_esc(preview)}</span></div>'
    )


def newest_step(steps: pd.DataFrame) -> int:
    """The step a browser opens on (``q.step_list``'s rows, at least one): the newest that has episodes, as
    a finished run's last step may hold only its final held-out evaluation (no episodes stored), and a step
    just begun none yet; the newest step where none has any."""
    with_episodes = steps[steps["episodes"] > 0]
    return int((steps if with_episodes.empty else with_episodes)["step"].iloc[-1])


class EpisodeTable(pn.widgets.DataFrame):
    """The page of episodes: Bokeh's own DataTable, without its row-number column.

    Not Tabulator: Tabulator's script loads only with ``pn.extension("tabulator")`` run after it was
    imported, so in a notebook that called ``pn.extension()`` first it would not render.
    """

    def _get_properties(self, doc: Any = None) -> dict[str, Any]:
        properties = super()._get_properties(doc)
        properties["index_position"] = None
        return properties


class TrajectoryBrowser(PeriodicRefresh, pn.viewable.Viewer):
    """Browse the stored episodes of one run: steps, a page of episodes, one episode's call tree."""

    step = param.Integer(default=None, allow_None=True, doc="The step whose episodes are listed (None: all).")
    page = param.Integer(default=0, bounds=(0, None), doc="The page of episodes shown (0-based).")
    role = param.String(default="", doc="Only episodes with a call of this role.")
    min_reward = param.Number(default=None, allow_None=True, doc="Only episodes rewarded at least this.")
    max_reward = param.Number(default=None, allow_None=True, doc="Only episodes rewarded at most this.")
    format_failures = param.Boolean(default=False, doc="Only episodes with a call that failed its format.")
    search = param.String(
        default="", doc="Only episodes with a call whose prompt or completion has this text."
    )
    colour_by = param.Selector(default="owner", objects=list(COLOURINGS), doc="How tokens are coloured.")
    episode = param.Integer(default=None, allow_None=True, doc="The open episode's id.")
    live = param.Boolean(default=False, doc="Refresh every interval_ms while displayed.")
    interval_ms = param.Integer(default=2000, bounds=(200, None), doc="How often a live browser refreshes.")

    def __init__(
        self,
        run_dir: str | Path,
        page_size: int = q.PAGE_SIZE,
        replay: ReplayForm | None = None,
        **params: Any,
    ) -> None:
        self.reader = RunReader(run_dir)
        self.replay = replay
        self.page_size = int(page_size)
        self.steps = q.step_list(self.reader)
        self.roles = q.role_list(self.reader)
        self.current = q.EpisodePage(pd.DataFrame(), 0, 0, self.page_size)
        self.calls: dict[int, _OpenCall] = {}
        self._callback: Any = None
        self._syncing = False
        self._step_chosen = "step" in params
        if not self._step_chosen and not self.steps.empty:
            params["step"] = newest_step(self.steps)
        super().__init__(**params)
        self._build_widgets()
        self.load_page()
        if self.episode is not None:
            self._show_episode()

    # ------------------------------------------------------------------ widgets
    def _build_widgets(self) -> None:
        info = self.reader.info()
        model = run_model(self.reader) or "—"
        self._header = pn.pane.HTML(
            f'<div data-run="{_esc(info["id"])}"><b>{_esc(info["name"] or info["id"])}</b> · '
            f"{_esc(info['id'])} · model {_esc(model)} · {_esc(info['status'])}</div>",
            css_classes=["wb-run-header"],
            sizing_mode="stretch_width",
        )
        self._step_select = pn.widgets.Select(
            label="Step",
            options=self._step_options(),
            value=self._step_value(),
            css_classes=["wb-steps"],
            width=330,
        )
        self._step_select.param.watch(self._step_picked, "value")
        self._role_select = pn.widgets.Select(
            label="Role",
            options=self._role_options(),
            value=self.role or _ANY_ROLE,
            css_classes=["wb-filter-role"],
            width=160,
        )
        self._role_select.param.watch(
            lambda e: setattr(self, "role", "" if e.new == _ANY_ROLE else e.new), "value"
        )
        self._min_reward = pn.widgets.FloatInput.from_param(
            self.param.min_reward, label="Min reward", css_classes=["wb-filter-min-reward"], width=110
        )
        self._max_reward = pn.widgets.FloatInput.from_param(
            self.param.max_reward, label="Max reward", css_classes=["wb-filter-max-reward"], width=110
        )
        self._format = pn.widgets.Checkbox.from_param(
            self.param.format_failures, label="Format failures only", css_classes=["wb-filter-format"]
        )
        self._search = pn.widgets.TextInput.from_param(
            self.param.search, label="Search text", placeholder="text in a prompt or completion (Enter)",
            css_classes=["wb-filter-search"], width=260,
        )  # fmt: skip
        self._colour = pn.widgets.RadioButtonGroup.from_param(
            self.param.colour_by, label="Colour tokens by", css_classes=["wb-colour-by"]
        )
        self._refresh = pn.widgets.Button(label="Refresh", css_classes=["wb-refresh"], width=90)
        self._refresh.on_click(lambda _e: self.refresh())
        self._table = EpisodeTable(
            pd.DataFrame(columns=_TABLE_COLUMNS),
            disabled=True,
            show_index=False,
            sortable=False,
            reorderable=False,
            widths=_TABLE_WIDTHS,  # relative: the columns share the table's width in these proportions
            row_height=ROW_HEIGHT,
            formatters={"episode": HTMLTemplateFormatter(template=_EPISODE_CELL)},
            titles={"task_id": "task", "group_key": "group", "format_errors": "format errors"},
            height=TABLE_HEIGHT,
            sizing_mode="stretch_width",
            css_classes=["wb-episodes"],
        )
        self._table.param.watch(self._row_picked, "selection")
        self._prev = pn.widgets.Button(label="◀ Prev", css_classes=["wb-prev"], width=90)
        self._next = pn.widgets.Button(label="Next ▶", css_classes=["wb-next"], width=90)
        self._prev.on_click(lambda _e: self.previous_page())
        self._next.on_click(lambda _e: self.next_page())
        self._page_text = pn.pane.HTML("", css_classes=["wb-page"])
        self._episode_header = pn.pane.HTML(
            "", css_classes=["wb-episode-header"], sizing_mode="stretch_width"
        )
        self._tree = pn.Column(self._episode_header, sizing_mode="stretch_width", css_classes=["wb-tree"])
        self._layout = pn.Column(
            self._header,
            pn.Row(self._step_select, self._refresh),
            pn.Row(self._role_select, self._min_reward, self._max_reward, self._search, self._format),
            self._table,
            pn.Row(self._prev, self._page_text, self._next),
            pn.Row(pn.pane.HTML("Colour tokens by"), self._colour),
            self._tree,
            css_classes=["wb-browser"],
            sizing_mode="stretch_width",
        )

    def _step_options(self) -> dict[str, int]:
        options = {"all steps": _ALL_STEPS}
        for row in self.steps.itertuples(index=False):
            reward = "" if pd.isna(row.mean_reward) else f" · reward {row.mean_reward:.3f}"
            running = " (running)" if row.status != "complete" else ""
            options[f"step {row.step} · {row.episodes} episodes · {row.calls} calls{reward}{running}"] = int(
                row.step
            )
        return options

    def _step_value(self) -> int:
        return _ALL_STEPS if self.step is None else int(self.step)

    def _role_options(self) -> list[str]:
        return [_ANY_ROLE, *self.roles] + ([self.role] if self.role and self.role not in self.roles else [])

    def _step_picked(self, event: Any) -> None:
        if self._syncing:
            return
        self._step_chosen = True
        self.step = None if event.new == _ALL_STEPS else int(event.new)

    def _sync_step_select(self) -> None:
        """Show ``step`` in the selector without taking it for the user's choice."""
        self._syncing = True
        try:
            self._step_select.value = self._step_value()
        finally:
            self._syncing = False

    # ------------------------------------------------------------------ episodes
    def filter(self) -> q.EpisodeFilter:
        """The current filters as a query argument."""
        return q.EpisodeFilter(
            role=self.role or None,
            min_reward=self.min_reward,
            max_reward=self.max_reward,
            format_failures=self.format_failures,
            search=self.search or None,
        )

    @param.depends("step", "role", "min_reward", "max_reward", "format_failures", "search", watch=True)
    def _filters_changed(self) -> None:
        self._sync_step_select()
        if self.role and self.role not in self._role_select.options:
            self._role_select.options = self._role_options()
        self._role_select.value = self.role or _ANY_ROLE
        if self.page:
            self.page = 0  # load_page follows
        else:
            self.load_page()

    @param.depends("page", watch=True)
    def load_page(self) -> None:
        """Read the current page of episodes (and the filtered total) from the store."""
        current = q.episodes_page(self.reader, self.step, self.page, self.page_size, self.filter())
        if current.page > 0 and current.page >= current.pages:  # fewer pages than before: the last one
            self.page = current.pages - 1
            return
        self.current = current
        rows = current.rows.rename(columns={"id": "episode"})
        rows["reward"] = pd.to_numeric(rows["reward"], errors="coerce").astype(float).round(4)
        rows = rows[_TABLE_COLUMNS]
        if not rows.equals(self._table.value):
            self._table.selection = []
            self._table.value = rows
        self._table.height = min(TABLE_HEIGHT, ROW_HEIGHT * (len(rows) + 1) + 12)
        self._page_text.object = (
            f'<span data-page="{current.page}" data-pages="{current.pages}" data-total="{current.total}">'
            f"page {current.page + 1} of {current.pages} · {current.total} episodes</span>"
        )
        self._prev.disabled = current.page == 0
        self._next.disabled = current.page + 1 >= current.pages

    @property
    def total(self) -> int:
        """How many episodes pass the current filters."""
        return self.current.total

    def next_page(self) -> None:
        if self.page + 1 < self.current.pages:
            self.page += 1

    def previous_page(self) -> None:
        if self.page > 0:
            self.page -= 1

    def refresh(self) -> None:
        """Re-read the steps, the roles and the current page (new steps of a run being written appear).

        Until a step is chosen, the browser follows the newest step that has episodes."""
        steps = q.step_list(self.reader)
        if not steps.equals(self.steps):
            self.steps = steps
            self._syncing = True
            try:
                self._step_select.options = self._step_options()
            finally:
                self._syncing = False
            newest = None if steps.empty else newest_step(steps)
            if not self._step_chosen and newest is not None and newest != self.step:
                self.step = newest  # reloads the page
                return
            self._sync_step_select()
        roles = q.role_list(self.reader)
        if roles != self.roles:
            self.roles = roles
            self._role_select.options = self._role_options()
        self.load_page()

    def _row_picked(self, event: Any) -> None:
        if event.new:
            rows = self._table.value
            index = event.new[0]
            if 0 <= index < len(rows):
                self.episode = int(rows["episode"].iloc[index])

    # ------------------------------------------------------------------ the call tree
    def open_episode(self, episode_id: int) -> None:
        """Show the call tree of episode ``episode_id`` (any episode of the run, on the page or not)."""
        self.episode = int(episode_id)

    def show_role(self, role: str, step: int | None = None) -> None:
        """List only the episodes with a call of ``role`` (at ``step`` where given and it stored episodes: not
        a finished run's evaluation-only last step) and open the first of them, that role's calls expanded
        (no episode open where none has one)."""
        if step is not None and int(step) in set(self.steps.loc[self.steps["episodes"] > 0, "step"]):
            self._step_chosen = True
            self.param.update(role=role, step=int(step))
        else:
            self.role = role
        rows = self.current.rows
        first = None if rows.empty else int(rows["id"].iloc[0])
        if first is not None and first == self.episode:
            self._show_episode()  # the same episode: opened again around the role's calls
        else:
            self.episode = first

    @param.depends("episode", watch=True)
    def _show_episode(self) -> None:
        self.calls = {}
        if self.episode is None:
            self._episode_header.object = ""
            self._tree.objects = [self._episode_header]
            return
        roots = q.call_tree(self.reader, self.episode)
        n_calls = sum(1 for _ in q.walk(roots))
        self._episode_header.object = (
            f'<div data-episode="{int(self.episode)}" data-calls="{n_calls}"><b>episode {int(self.episode)}</b> · '
            f"{n_calls} calls</div>"
        )
        cards = [self._card(node, 0, self._opens(node, i == 0)) for i, node in enumerate(roots)]
        if not cards:
            self._episode_header.object += '<div class="wb-empty">no calls stored for this episode</div>'
        form = []
        if self.replay is not None and roots:
            calls = [call for _, call in q.walk(roots)]
            self.replay.set_calls(calls)
            self.replay.select(next((c.id for c in calls if c.role == self.role), roots[0].id))
            form = [self.replay]
        self._tree.objects = [self._episode_header, *form, *cards]

    def _opens(self, node: q.StoredCall, first: bool) -> bool:
        """Whether a card opens expanded: with a role filter, on the way to that role's calls; else when it
        is the first top-level call."""
        if not self.role:
            return first
        return any(call.role == self.role for _, call in q.walk([node]))

    def _card(self, node: q.StoredCall, depth: int, expanded: bool) -> pn.Card:
        tokens = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["wb-call-tokens"])
        body = [pn.pane.HTML(call_fields_html(node), sizing_mode="stretch_width"), tokens]
        body += [self._card(child, depth + 1, self._opens(child, False)) for child in node.children]
        matched = ["wb-role-match"] if self.role and node.role == self.role else []
        made = pn.Card(
            *body,
            header=pn.pane.HTML(call_title_html(node), sizing_mode="stretch_width"),
            collapsed=not expanded,
            css_classes=["wb-call", f"wb-depth-{depth}", *matched],
            sizing_mode="stretch_width",
            margin=(4, 0, 4, 12 * depth),
        )
        self.calls[node.id] = _OpenCall(node, made, tokens)
        made.param.watch(lambda e, call_id=node.id: self._expanded(call_id, e.new), "collapsed")
        if expanded:
            self._render_tokens(node.id)
        return made

    def _expanded(self, call_id: int, collapsed: bool) -> None:
        if not collapsed:
            self._render_tokens(call_id)
            if self.replay is not None:
                self.replay.select(call_id)  # expanding a call picks it for a replay

    def _render_tokens(self, call_id: int, force: bool = False) -> None:
        """Fill a call card's token pane (read from the store the first time)."""
        opened = self.calls[call_id]
        if opened.detail is None:
            opened.detail = call_tokens(self.reader, call_id)
        elif opened.tokens.object and not force:
            return
        opened.tokens.object = tokens_html(opened.detail, self.colour_by)

    @param.depends("colour_by", watch=True)
    def _recolour(self) -> None:
        for call_id, opened in self.calls.items():
            if opened.detail is not None:
                self._render_tokens(call_id, force=True)

    # ------------------------------------------------------------------ live and view
    def _tick(self) -> None:
        self.refresh()

    def close(self) -> None:
        """Stop refreshing (and following a launched replay) and close the store reader."""
        self.stop()
        if self.replay is not None:
            self.replay.close()
        self.reader.close()

    def __panel__(self) -> pn.viewable.Viewable:
        if self.live:
            self.start()
        return self._layout
