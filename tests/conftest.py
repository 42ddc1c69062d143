"""Shared pytest configuration: hypothesis profiles and the repository root."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings

REPO_ROOT = Path(__file__).resolve().parent.parent

# `ci` keeps the whole suite within minutes on two cores; `thorough` is for long runs.
settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=10, deadline=None)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)

# Negative and boundary cases checked per drawn instance of a rule (None: every derived
# case). A large pattern derives ~150 per instance; `ci` checks a sample covering every
# kind of case, `thorough` all of them.
NEGATIVES_PER_INSTANCE = None if PROFILE == "thorough" else 24
