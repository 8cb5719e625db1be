"""`python -m specdec_utils --prepare`: convert the embedded target to safetensors once (`make
setup` runs it); `python -m specdec_utils --list`: the model names `load_model` knows."""
import argparse
import sys

from .models import UnknownModelError, ensure_target_cache, known_names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_utils", description="The course's model zoo.")
    parser.add_argument("--prepare", action="store_true", help="convert the embedded target to safetensors now")
    parser.add_argument("--list", action="store_true", help="print the known model names")
    args = parser.parse_args(argv)
    if args.list or not args.prepare:
        print("\n".join(known_names()))
    if args.prepare:
        try:
            print(f"target ready: {ensure_target_cache()}")
        except UnknownModelError as err:
            print(f"specdec_utils: error: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
