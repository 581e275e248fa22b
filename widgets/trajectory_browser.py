"""TrajectoryBrowser: a run's steps, a page of episodes, and one episode's call tree with its tokens.

Steps → episodes (paginated on the server, filtered by role, reward range, format failures and text) →
the call tree of the chosen episode: nested cards by parent call, each with role, policy and version,
rewards, advantage, format error, parsed tool calls and their results, and the completion's tokens
coloured by owner, logprob or advantage (``widgets.token_view``). Only the current page and the open
episode are ever read from the store (``widgets.run_queries``).

CSS classes a browser test can find: ``wb-browser``, ``wb-episodes`` (the page's table), ``wb-page``
(the "page i of n" text), ``wb-call`` (a call's card, header ``role · call id``), ``tok`` (a token).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import panel as pn
import param

from widgets import run_queries as q
from widgets.token_view import COLOURINGS, tokens_html
from workbench.store import RunReader


class TrajectoryBrowser(pn.viewable.Viewer):
    """Browse the stored episodes of one run."""

    step = param.Integer(default=0, doc="The step whose episodes are listed.")
    page = param.Integer(default=0, bounds=(0, None), doc="The page of episodes shown.")
    role = param.String(default="", doc="Only episodes with a call of this role.")
    min_reward = param.Number(default=None, allow_None=True, doc="Only episodes rewarded at least this.")
    max_reward = param.Number(default=None, allow_None=True, doc="Only episodes rewarded at most this.")
    format_failures = param.Boolean(default=False, doc="Only episodes with a format failure.")
    search = param.String(default="", doc="Only episodes whose prompts or completions contain this text.")
    colour_by = param.Selector(default="owner", objects=list(COLOURINGS), doc="Token colouring.")
    episode = param.Integer(default=None, allow_None=True, doc="The open episode's id.")

    def __init__(self, run_dir: str | Path, page_size: int = q.PAGE_SIZE, **params: Any) -> None:
        self._table = pn.widgets.Tabulator(
            disabled=True, selectable=1, show_index=False, sizing_mode="stretch_width",
            css_classes=["wb-episodes"],
        )  # fmt: skip
        self._page_text = pn.pane.HTML(css_classes=["wb-page"])
        self._tree = pn.Column(sizing_mode="stretch_width", css_classes=["wb-tree"])
        self.reader = RunReader(run_dir)
        self.page_size = page_size
        self.total = 0
        self.steps = q.steps(self.reader)
        if not self.steps.empty and "step" not in params:
            params["step"] = int(self.steps["step"].iloc[-1])
        super().__init__(**params)
        self._table.param.watch(self._pick, "selection")
        self._step_select = pn.widgets.Select(label="step", options=self._step_options(), value=self.step)
        self._step_select.link(self, value="step")
        self.load_page()

    # ------------------------------------------------------------------ queries
    def filter(self) -> q.EpisodeFilter:
        return q.EpisodeFilter(
            role=self.role or None,
            min_reward=self.min_reward,
            max_reward=self.max_reward,
            format_failures=self.format_failures,
            search=self.search or None,
        )

    @param.depends("step", "role", "min_reward", "max_reward", "format_failures", "search", watch=True)
    def _filters_changed(self) -> None:
        if self.page:
            self.page = 0  # triggers load_page
        else:
            self.load_page()

    @param.depends("page", watch=True)
    def load_page(self) -> None:
        """Read the current page of episodes from the store."""
        frame, self.total = q.episodes_page(self.reader, self.step, self.page, self.page_size, self.filter())
        self._table.value = frame
        pages = max(1, -(-self.total // self.page_size))
        self._page_text.object = (
            f'<span data-total="{self.total}">page {self.page + 1} of {pages} · {self.total} episodes</span>'
        )

    def refresh(self) -> None:
        """Re-read the steps (a run being written has new ones) and the current page."""
        self.steps = q.steps(self.reader)
        self._step_select.options = self._step_options()
        self.load_page()

    def _step_options(self) -> list[int]:
        return [int(s) for s in self.steps["step"]] or [0]

    def next_page(self) -> None:
        if (self.page + 1) * self.page_size < self.total:
            self.page += 1

    def previous_page(self) -> None:
        if self.page > 0:
            self.page -= 1

    def _pick(self, event: Any) -> None:
        if event.new:
            self.episode = int(self._table.value.iloc[event.new[0]]["id"])

    # ------------------------------------------------------------------ the call tree
    @param.depends("episode", "colour_by", watch=True)
    def show_episode(self) -> None:
        if self.episode is None:
            self._tree.objects = []
            return
        tree = q.call_tree(self.reader, self.episode)
        kids = q.children(tree)

        def card(i: int) -> pn.Card:
            row = tree.iloc[i]
            body = [pn.pane.HTML(self._details(row), sizing_mode="stretch_width")]
            tokens = q.call_tokens(self.reader, int(row["id"]))
            body.append(pn.pane.HTML(tokens_html(tokens, self.colour_by), sizing_mode="stretch_width"))
            body += [card(j) for j in kids.get(int(row["id"]), [])]
            return pn.Card(
                *body,
                title=f"{row['role']} · call {int(row['id'])}",
                collapsed=bool(pd_notna(row["parent_id"])),
                css_classes=["wb-call"],
                sizing_mode="stretch_width",
            )

        self._tree.objects = [card(i) for i in kids.get(None, [])]

    @staticmethod
    def _details(row: Any) -> str:
        def fmt(value: Any) -> str:
            return html.escape(json.dumps(value, default=str)) if value not in (None, "") else "—"

        fields = {
            "policy": f"{row['policy'] or '—'} (version {row['policy_version']})",
            "rewards": fmt(row["rewards"]),
            "advantage": "—" if not pd_notna(row["advantage"]) else f"{row['advantage']:.3f}",
            "format error": html.escape(str(row["format_error"])) if pd_notna(row["format_error"]) else "—",
            "parsed": fmt(row["action"]),
            "tool calls": fmt(row["tool_calls"]),
            "tool results": fmt(row["tool_results"]),
        }
        items = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in fields.items())
        return f'<dl class="wb-call-fields" style="display:grid;grid-template-columns:8em 1fr">{items}</dl>'

    # ------------------------------------------------------------------ view
    def __panel__(self) -> pn.viewable.Viewable:
        previous = pn.widgets.Button(name="◀ Prev", css_classes=["wb-prev"])
        following = pn.widgets.Button(name="Next ▶", css_classes=["wb-next"])
        previous.on_click(lambda _e: self.previous_page())
        following.on_click(lambda _e: self.next_page())
        filters = pn.Row(
            self._step_select,
            pn.widgets.TextInput.from_param(self.param.role, placeholder="any role"),
            pn.widgets.FloatInput.from_param(self.param.min_reward),
            pn.widgets.FloatInput.from_param(self.param.max_reward),
            pn.widgets.Checkbox.from_param(self.param.format_failures),
            pn.widgets.TextInput.from_param(self.param.search, placeholder="search text"),
            pn.widgets.RadioButtonGroup.from_param(self.param.colour_by),
        )
        return pn.Column(
            filters,
            self._table,
            pn.Row(previous, self._page_text, following),
            self._tree,
            css_classes=["wb-browser"],
            sizing_mode="stretch_width",
        )

    def close(self) -> None:
        self.reader.close()


def pd_notna(value: Any) -> bool:
    import pandas as pd

    return value is not None and not (isinstance(value, float) and pd.isna(value)) and value is not pd.NA
