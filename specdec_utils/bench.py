"""`python -m specdec_utils.bench`: the benchmark CLI (its code lives in `tools/bench.py`).

Kept at this path because the command is the course's public interface; `from specdec_utils import bench`
gives the same module as `specdec_utils.tools.bench`."""
import sys

from .tools import bench as _bench

if __name__ == "__main__":
    raise SystemExit(_bench.main())
sys.modules[__name__] = _bench
