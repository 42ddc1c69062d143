"""`onnxfuse plan` on every zoo model, given only what the manifest says of its inputs:
their shapes (`--input-shape`) and the values it fixes (`--input-value`: a sample rate an
If branches on). The plan must pass its checker (plan does that before it returns) and
the model must run inside the arena with onnxruntime's outputs (`--verify`).

Where that fails today, the model is in KNOWN_PLAN_GAPS with the reason; the list is
asserted exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from onnxfuse.cli.main import main
from onnxfuse.zoo.models import FetchError, load_manifest, model_path

pytestmark = pytest.mark.slow

MANIFEST = load_manifest(Path(__file__).with_name("manifest.yaml"))

KNOWN_PLAN_GAPS: dict[str, str] = {}


def _arguments(name: str) -> list[str]:
    model = MANIFEST[name]
    try:
        path = model_path(model, MANIFEST)
    except FetchError as exc:
        pytest.skip(f"{name}: cannot fetch ({exc})")
    args = ["plan", str(path), "--verify"]
    for spec in model.inputs:
        args += ["--input-shape", f"{spec.name}=" + ",".join(map(str, spec.shape))]
        if spec.value is not None and spec.dtype != "bool":
            args += ["--input-value", f"{spec.name}={spec.value}"]
    return args


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_plan_sizes_and_verifies_every_zoo_model(name, capsys):
    code = main(_arguments(name))
    captured = capsys.readouterr()
    if name in KNOWN_PLAN_GAPS:
        assert code == 2, f"{name} plans now: remove it from KNOWN_PLAN_GAPS"
        return
    assert code == 0, captured.err
    assert "verify: outputs match onnxruntime" in captured.out
