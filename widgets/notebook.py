"""Panel's notebook set-up that keeps saved notebooks small and works offline.

``pn.extension(inline=True)`` works without a network but writes Bokeh's and Panel's JavaScript (about
5 MB, twice: once per output format) into the notebook, and ``pn.extension()`` loads it from a CDN. In
JupyterLab and Notebook 7, Panel's Jupyter server extension (installed and enabled with Panel) already
serves those same files at ``/panel-preview/static/``; ``extension()`` points the one loader output at them:

    import widgets
    widgets.extension("jsoneditor")     # in place of pn.extension("jsoneditor", inline=True)

The saved notebook then holds a few kilobytes of loader instead of megabytes. Where no Jupyter server with
Panel's extension renders the notebook (VS Code, a static viewer), use ``pn.extension(inline=True)``.
Under JupyterHub the server's prefix comes from ``JUPYTERHUB_SERVICE_PREFIX``; Panel's own stylesheets
for single components still link its CDN, as with ``inline=True`` (offline they fall back to the defaults).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Where Panel's Jupyter server extension serves Bokeh's and Panel's static files.
STATIC_ROUTE = "panel-preview"


def server_prefix() -> str:
    """The Jupyter server's URL prefix for Panel's static files (``/panel-preview`` outside JupyterHub)."""
    base = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
    return f"{base.rstrip('/')}/{STATIC_ROUTE}"


@contextmanager
def _scripts_from_jupyter_server() -> Iterator[None]:
    """While Panel writes its loader: resources in server mode, their paths under the Jupyter server's route."""
    import panel.io.notebook as panel_notebook
    from bokeh.resources import Resources
    from panel import state
    from panel.util import edit_readonly

    cdn, rel_path = panel_notebook.CDN, state.rel_path
    panel_notebook.CDN = Resources(mode="server")  # what load_notebook uses when inline is off
    with edit_readonly(state):
        state.rel_path = server_prefix()
    try:
        yield
    finally:
        panel_notebook.CDN = cdn
        with edit_readonly(state):
            state.rel_path = rel_path or None


def extension(*names: str, **params: Any) -> None:
    """``pn.extension(*names, **params)`` with Bokeh's and Panel's JavaScript loaded from the Jupyter server."""
    import panel as pn

    with _scripts_from_jupyter_server():
        pn.extension(*names, inline=False, **params)
