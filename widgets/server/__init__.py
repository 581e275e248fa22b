"""The served application: ``workbench serve`` and what guards its door.

``serve`` starts the team dashboard (``widgets.dashboard``) on a Panel server; ``gate`` stands in front of
every route, ``login`` signs users in against ``access`` (the users file, password checks, lockouts),
``sessions`` keeps the server-side sessions the signed cookie names, and ``operator_api`` answers the
operators' JSON requests. The views it serves, and that a notebook displays, are in ``widgets`` itself; they
never import this package (an import-linter contract in ``pyproject.toml``): only ``workbench.cli`` does.
"""
