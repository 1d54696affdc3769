"""The project's images built from images/Dockerfile without a registry (docs/images.md,
"Images without a registry"): local base images from Debian packages, BuildKit with named
contexts replacing each ``FROM``, OCI archives cached by content.
"""

from __future__ import annotations

from taskhandler_devenv.images.build import ImageBuildError, app_version, build_images, image_ref

__all__ = ["ImageBuildError", "app_version", "build_images", "image_ref"]
