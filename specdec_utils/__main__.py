"""`python -m specdec_utils --prepare`: convert the embedded target to safetensors once and unpack the shipped
weights under data/models (`make setup` runs it); `python -m specdec_utils --pack FOLDER ...`: store a folder's
safetensors files lzma-packed (`models.pack`); `python -m specdec_utils --list`: the model names `load_model` knows;
`python -m specdec_utils --machine`: the device, dtype and preset a notebook would pick here (the header of
`make test-gpu`'s logs)."""
import argparse
import sys

from .models import MODELS_DIR, UnknownModelError, ensure_target_cache, known_names, pack, unpacked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_utils", description="The course's model zoo.")
    parser.add_argument("--prepare", action="store_true",
                        help="convert the embedded target to safetensors and unpack the shipped weights now")
    parser.add_argument("--pack", nargs="+", metavar="FOLDER",
                        help="store each FOLDER's *.safetensors lzma-packed (NAME.xz, lossless) in place")
    parser.add_argument("--list", action="store_true", help="print the known model names")
    parser.add_argument("--machine", action="store_true", help="print the device, dtype and preset chosen here")
    args = parser.parse_args(argv)
    if args.machine:
        import os

        from .models import get_preset
        from .utils import default_dtype, device_summary, get_device, low_precision_dtype
        device = get_device()
        print(f"machine: {device_summary(device)} | device {device} | default dtype {default_dtype(device)}, "
              f"16-bit {low_precision_dtype(device)} (SPECDEC_DTYPE={os.environ.get('SPECDEC_DTYPE', 'unset')}) "
              f"| preset {get_preset()['name']}")
        return 0
    if args.pack:
        for folder in args.pack:
            try:
                for path in pack(folder):
                    print(f"packed: {path} ({path.stat().st_size:,} bytes)")
            except FileNotFoundError as err:
                print(f"specdec_utils: error: {err}", file=sys.stderr)
                return 2
        return 0
    if args.list or not args.prepare:
        print("\n".join(known_names()))
    if args.prepare:
        try:
            print(f"target ready: {ensure_target_cache()}")
        except UnknownModelError as err:
            print(f"specdec_utils: error: {err}", file=sys.stderr)
            return 2
        for folder in sorted(p for p in MODELS_DIR.iterdir() if p.is_dir()) if MODELS_DIR.is_dir() else []:
            where = unpacked(folder)
            if where != folder:
                print(f"unpacked: {folder.name} -> {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
