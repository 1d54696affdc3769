"""What a released project states about itself agrees everywhere it is stated: LICENSE is the
verbatim text of the licence pyproject.toml declares (and the wheel ships), the chart's Artifact
Hub annotations name that licence, the images the chart's default values run (at the
appVersion tag) and working links, and the package, the chart and the images carry one version.
The images' labels are checked against the same licence in test_images.py; the images Artifact
Hub lists against the rendered chart in tests/integration/chart/test_artifacthub.py."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any

import yaml

from taskhandler_operator import __version__

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "taskhandler-operator"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
VALUES = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
# sha256 of a licence's verbatim text -> its SPDX id. Apache-2.0: the text the ASF publishes
# (www.apache.org/licenses/LICENSE-2.0.txt; Debian's /usr/share/common-licenses/Apache-2.0).
KNOWN_LICENCES = {
    "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30": "Apache-2.0",
}


def license_spdx_id() -> str:
    digest = hashlib.sha256((REPO / "LICENSE").read_bytes()).hexdigest()
    assert digest in KNOWN_LICENCES, "LICENSE is not the verbatim text of a known licence"
    return KNOWN_LICENCES[digest]


def annotation(key: str) -> Any:
    return yaml.safe_load(CHART_META["annotations"][f"artifacthub.io/{key}"])


def test_license_is_the_licence_pyproject_declares_and_the_wheel_ships() -> None:
    assert PYPROJECT["project"]["license"] == license_spdx_id() == "Apache-2.0"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    # A `license` string (an SPDX expression, PEP 639) needs setuptools 77 or later.
    assert "setuptools>=77" in PYPROJECT["build-system"]["requires"]


def test_artifacthub_names_the_licence() -> None:
    assert annotation("license") == license_spdx_id()


def test_artifacthub_lists_the_default_values_images_at_the_app_version() -> None:
    listed = annotation("images")
    assert [set(entry) for entry in listed] == [{"name", "image"}] * len(listed)
    tag = CHART_META["appVersion"]
    runtimes = VALUES["probe"]["runtimeImages"]
    repositories = [VALUES["image"]["repository"]] + [
        image["repository"] or VALUES["image"]["repository"] for image in runtimes.values()
    ]
    assert sorted(e["image"] for e in listed) == sorted({f"{r}:{tag}" for r in repositories})
    assert [e["name"] for e in listed] == [e["image"].split("/")[-1].split(":")[0] for e in listed]


def test_artifacthub_links_point_into_the_project() -> None:
    links = annotation("links")
    assert {link["name"] for link in links} >= {"Documentation", "Issues"}
    for link in links:
        assert link["url"].startswith(CHART_META["home"] + "/"), link


def test_package_chart_and_images_carry_one_version() -> None:
    assert PYPROJECT["project"]["version"] == __version__ == CHART_META["appVersion"]
