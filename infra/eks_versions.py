"""EKS Kubernetes versions and their support windows, to refuse a version EKS no longer runs.

Dates (UTC) from the Amazon EKS Kubernetes release calendar, awsdocs/amazon-eks-user-guide
``latest/ug/versioning/kubernetes-versions.adoc`` (1.29 to 1.34). That snapshot predates 1.35: its dates (EKS release
2026-01-27) are from endoflife.date/amazon-eks, which tracks the calendar. Standard support lasts 14 months from the
EKS release, extended support 12 more; past that EKS upgrades the control plane by itself and creates no cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from enum import Enum


@dataclass(frozen=True)
class SupportWindow:
    end_of_standard: date
    end_of_extended: date


EKS_VERSIONS: dict[str, SupportWindow] = {
    "1.29": SupportWindow(date(2025, 3, 23), date(2026, 3, 23)),
    "1.30": SupportWindow(date(2025, 7, 23), date(2026, 7, 23)),
    "1.31": SupportWindow(date(2025, 11, 26), date(2026, 11, 26)),
    "1.32": SupportWindow(date(2026, 3, 23), date(2027, 3, 23)),
    "1.33": SupportWindow(date(2026, 7, 29), date(2027, 7, 29)),
    "1.34": SupportWindow(date(2026, 12, 2), date(2027, 12, 2)),
    "1.35": SupportWindow(date(2027, 3, 27), date(2028, 3, 27)),
}


class Support(Enum):
    STANDARD = "standard"
    EXTENDED = "extended"
    ENDED = "ended"


def support(version: str, today: date) -> Support:
    """Where ``version`` stands on ``today``; a support period ends at the start of its end date (UTC)."""
    window = EKS_VERSIONS[version]
    if today < window.end_of_standard:
        return Support.STANDARD
    if today < window.end_of_extended:
        return Support.EXTENDED
    return Support.ENDED


def check_version(version: str, today: date, allow_extended: bool) -> None:
    """Raise ValueError, naming the config key, unless ``version`` is in standard support (or extended, if allowed)."""
    if version not in EKS_VERSIONS:
        raise ValueError(f"kubernetes_version {version!r} is not an EKS version (known: {', '.join(EKS_VERSIONS)})")
    window = EKS_VERSIONS[version]
    state = support(version, today)
    if state is Support.ENDED:
        raise ValueError(f"kubernetes_version {version!r} left EKS extended support on {window.end_of_extended}")
    if state is Support.EXTENDED and not allow_extended:
        raise ValueError(
            f"kubernetes_version {version!r} left EKS standard support on {window.end_of_standard} (extended support "
            f"costs extra per cluster hour until {window.end_of_extended}): upgrade, or set "
            "cluster.allow_extended_support: true"
        )
