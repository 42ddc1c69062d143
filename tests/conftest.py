"""Shared pytest configuration: hypothesis profiles and the repository root."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
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

# Loaded rules and targets are cached in a folder of this run's own (each worker's; the
# command-line tests' children inherit it), not in the user's ~/.cache.
if "ONNXFUSE_CACHE_DIR" not in os.environ:
    _CACHE = tempfile.mkdtemp(prefix="onnxfuse-test-cache-")
    os.environ["ONNXFUSE_CACHE_DIR"] = _CACHE
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
settings.load_profile(PROFILE)

# Negative and boundary cases checked per drawn instance of a rule (None: every derived
# case). A large pattern derives ~150 per instance; `ci` checks a sample covering every
# kind of case, `thorough` all of them.
NEGATIVES_PER_INSTANCE = None if PROFILE == "thorough" else 24


# --------------------------------------------------------------------------- pytest-xdist
# `-n 2 --dist loadscope` (pyproject's addopts) runs the suite on two worker processes,
# handing each one whole units of tests that must share a worker:
#   - a test module: its module-scoped fixtures (an optimized model, a venv, the measured
#     exports) are then computed once, not once per worker;
#   - in tests/proof/test_rule_properties.py, one rule's tests: the negative test reuses
#     the instances its rule's positive test fired on in the same process, and that module
#     is most of the suite's time, so it is split per rule.
# (xdist's own `loadgroup` marks cannot do this with pytest 9: the group is appended to
# `item._nodeid`, which pytest 9 no longer reads.) Without `-n`, nothing here runs.

RULE_PROPERTIES = "tests/proof/test_rule_properties.py"


# The modules that run jobs on Ray (`*_on_ray.py`) are one unit: one worker starts the
# session's Ray (the `local_ray` fixture) once, not once per worker.
ON_RAY = "_on_ray.py"


def work_unit(nodeid: str) -> str:
    """The unit a test is scheduled with: its module, or its module and rule."""
    module, _, name = nodeid.partition("::")
    if module.endswith(RULE_PROPERTIES) and name.endswith("]") and "[" in name:
        return f"{module}[{name[name.index('[') + 1 :]}"
    if module.endswith(ON_RAY):
        return ON_RAY
    return module


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown when xdist is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return _WorkUnits(config, log)


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray of 2 CPUs for the session; the commands run with --ray join it."""
    ray = pytest.importorskip(
        "ray", reason="Ray is not installed (pip install 'onnxfuse[ray]'; CI installs it)"
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
