"""Build the quick start's example image (busybox-static in one layer) as an OCI archive.

Usage: python packaging/build_example_image.py OUT.tar [REF]
"""

from __future__ import annotations

import sys
from pathlib import Path

from fleet.testing.oci_image import build_busybox_image, busybox_problem, write_oci_archive


def main() -> None:
    out = Path(sys.argv[1])
    ref = sys.argv[2] if len(sys.argv) > 2 else "docker.io/library/busybox:fleet"
    problem = busybox_problem(Path("/bin/busybox"))
    if problem:
        sys.exit(f"cannot build the example image: {problem} (install busybox-static)")
    write_oci_archive(build_busybox_image(), out, ref)
    print(f"wrote {out} ({ref})")


if __name__ == "__main__":
    main()
