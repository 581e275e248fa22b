"""Panel's notebook set-up that keeps saved notebooks small and works offline.

``pn.extension(inline=True)`` works without a network but writes Bokeh's and Panel's JavaScript (about
5 MB, twice: once per output format) into the notebook, and ``pn.extension()`` loads it from a CDN. In
JupyterLab and Notebook 7, Panel's Jupyter server extension (installed and enabled with Panel) already
serves those same files at ``/panel-preview/static/``; ``extension()`` points the one loader output at them:

    import widgets
    widgets.extension("jsoneditor")     # in place of pn.extension("jsoneditor", inline=True)

The saved notebook then holds a few kilobytes of loader instead of megabytes. Where no Jupyter server with
Panel's extension renders the notebook (VS Code, a static viewer), use ``pn.extension(inline=True)``.
Under JupyterHub the server's prefix comes from ``JUPYTERHUB_SERVICE_PREFIX``.

Panel links its theme and component stylesheets (``default.css``, ``native.css``, ``button.css``,
``select.css``, ...) from its CDN in a notebook, even with ``inline=True``; offline they fail and components lose
their look (the TopologyEditor's canvas nodes their boxes). After ``extension()`` every Panel object a
notebook displays links them from the same Jupyter server route instead (Panel's own ``resources='server'``
rendering does the same for ``/panel-preview`` only), including the components it adds later: the page looks
as it does under ``workbench serve`` and fetches nothing from outside.
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


def dist_url() -> str:
    """Where the Jupyter server serves Panel's own files (its ``dist`` directory: CSS, themes, bundles)."""
    return f"{server_prefix()}/static/extensions/panel/"


def _stylesheets_from_jupyter_server() -> None:
    """Make every Panel object displayed from now on link Panel's stylesheets from the Jupyter server."""
    import panel.viewable as viewable
    from panel.io.resources import patch_model_css

    render = viewable.render_mimebundle
    if getattr(render, "_local_stylesheets", False):
        return

    def render_with_local_stylesheets(
        model: Any, doc: Any, comm: Any, manager: Any = None, location: Any = None, resources: str = "cdn"
    ) -> Any:
        url = dist_url()
        patch_model_css(model, dist_url=url)  # the stylesheets of the models rendered now
        doc._template_variables["dist_url"] = url  # and of those Panel adds to this output later
        return render(model, doc, comm, manager, location, resources)

    render_with_local_stylesheets._local_stylesheets = True  # type: ignore[attr-defined]
    viewable.render_mimebundle = render_with_local_stylesheets


def extension(*names: str, **params: Any) -> None:
    """``pn.extension(*names, **params)`` with Bokeh's and Panel's JavaScript, and Panel's stylesheets, loaded
    from the Jupyter server."""
    import panel as pn

    with _scripts_from_jupyter_server():
        pn.extension(*names, inline=False, **params)
    _stylesheets_from_jupyter_server()
