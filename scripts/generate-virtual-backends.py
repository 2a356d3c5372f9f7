#!/usr/bin/env python
"""Regenerate the virtual backends d0 ships (workers/engine/coverage/backends/) from the installed torch's own
native_functions.yaml. Run it after bumping torch in requirements.txt; tests/test_coverage_backends.py fails until
the shipped lists match the installed torch.

    .venv/bin/python scripts/generate-virtual-backends.py [--keys CUDA MPS CPU] [--yaml PATH] [--version 2.13.0]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.engine.coverage.native_functions import (  # noqa: E402
    GENERATED_KEYS,
    composite_operators,
    kernel_table,
    operators_with,
    yaml_path,
)
from workers.engine.coverage.shipped_backends import (  # noqa: E402
    BACKENDS_DIR,
    GENERATED_BY,
    backend_file_name,
    composite_file_name,
    torch_label,
)

DESCRIPTIONS = {
    "CUDA": "NVIDIA GPUs (and AMD GPUs: ROCm builds register the same CUDA kernels)",
    "MPS": "Apple GPUs (Metal Performance Shaders)",
    "CPU": "x86 and Arm CPUs",
}


def installed_torch_version() -> str:
    from importlib.metadata import version

    return version("torch").split("+")[0]


def write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def generate(keys, yaml_file: Path, version: str, directory: Path = BACKENDS_DIR) -> list[Path]:
    table = kernel_table(yaml_file)
    directory.mkdir(parents=True, exist_ok=True)
    # Lists of an earlier torch go: the shipped lists describe the pinned torch only.
    for old in directory.glob("torch-*.json"):
        if json.loads(old.read_text()).get("generated_by") == GENERATED_BY:
            old.unlink()
    source = "torchgen/packaged/ATen/native/native_functions.yaml"
    written = []
    for key in keys:
        operators = operators_with(table, key)
        path = directory / backend_file_name(version, key)
        what = DESCRIPTIONS.get(key, f"the {key} dispatch key")
        write(path, {
            "name": path.stem, "dispatch_key": key, "torch": version, "source": source, "generated_by": GENERATED_BY,
            "description": f"torch {version}'s own {key} kernels ({len(operators)} operators): {what}. Operators "
                           "it runs through composite kernels are found by the coverage check.",
            "operators": operators,
        })
        written.append(path)
    path = directory / composite_file_name(version)
    write(path, {"torch": version, "source": source, "generated_by": GENERATED_BY,
                 "kernels": composite_operators(table)})
    written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", nargs="+", default=list(GENERATED_KEYS), help="dispatch keys (default: %(default)s)")
    parser.add_argument("--yaml", type=Path, help="native_functions.yaml (default: the installed torch's)")
    parser.add_argument("--version", help="torch version the yaml belongs to (default: the installed torch's)")
    args = parser.parse_args(argv)
    version = args.version or installed_torch_version()
    for path in generate(args.keys, args.yaml or yaml_path(), version):
        print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    print(f"torch {version} ({torch_label(version)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
