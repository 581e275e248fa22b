"""``python -m tests.perf [--quick] [--profile cpu|gpu] [--only a,b] [--out DIR]``: the whole benchmark suite.

See tests/perf/suite.py.
"""

from tests.perf.suite import main

if __name__ == "__main__":
    raise SystemExit(main())
