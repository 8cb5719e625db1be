"""The benchmark command line lives in the lab: `python -m specdec_lab.bench` (same methods and flags).

`python -m specdec_utils.bench ...` stops with one line naming it; the learner's package never imports the lab."""
import sys

REPLACEMENT = "python -m specdec_lab.bench"

if __name__ == "__main__":
    print(f"specdec_utils.bench: the benchmark moved to the lab: run {REPLACEMENT} {' '.join(sys.argv[1:])}".rstrip(),
          file=sys.stderr)
    raise SystemExit(2)
raise ImportError(f"specdec_utils.bench moved to the lab: import specdec_lab.bench (CLI: {REPLACEMENT}); "
                  "a lesson measures with specdec_utils.measure")
