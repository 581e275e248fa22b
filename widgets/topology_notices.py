"""How the TopologyEditor reports what goes wrong in a UI callback: on the page, never into the server.

``reported`` wraps a callback of an object with a ``_notice(text)`` method: a user's error (``USER_ERRORS``: a
bad name, YAML that does not parse, a spec that does not validate, a missing file) shows as a notice under the
banner; anything else is a bug, logged with its traceback and named on the page as an internal error.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import yaml

from workbench.topology.validate import TopologyError

logger = logging.getLogger("widgets.topology_editor")

#: Errors a user's edit can raise: shown on the page, not logged.
USER_ERRORS = (ValueError, KeyError, TypeError, yaml.YAMLError, TopologyError, FileNotFoundError)


def reported(method: Callable) -> Callable:
    """A UI callback whose errors show on the page (``self._notice``) instead of escaping into the server."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except USER_ERRORS as error:
            self._notice(str(error))
        except Exception as error:  # noqa: BLE001 - a bug: say so on the page and in the log
            logger.exception("topology editor: %s failed", method.__name__)
            self._notice(f"internal error in {method.__name__}: {error!r}")
        return None

    return run
