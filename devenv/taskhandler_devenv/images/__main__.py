"""``python -m taskhandler_devenv.images`` (hack/build-images.sh): build the images if needed.

Progress goes to stderr; the last stdout lines are ``image <ref> <archive>``, one per image.
"""

from __future__ import annotations

import sys

from taskhandler_devenv.images.build import ImageBuildError, build_images


def main() -> int:
    try:
        built = build_images()
    except ImageBuildError as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    for ref, archive in built.items():
        print(f"image {ref} {archive.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
