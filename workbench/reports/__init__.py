"""Paper reports: the data of each figure and table taken from runs, saved figures, and `reproduce`.

The notebooks under ``reports/<paper>/`` are thin: they read runs through :mod:`.series`, draw
with matplotlib, save through :mod:`.figures` (PNG, SVG and the plotted data as JSON, so tests
check panels and series without looking at pixels) and are executed headlessly by
:mod:`.reproduce` (``workbench reproduce``).
"""
