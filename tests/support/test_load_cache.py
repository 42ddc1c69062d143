"""The on-disk cache of loaded rules and targets: same rules, same results, never stale."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import relu_relu_rule

from onnxfuse import api
from onnxfuse.errors import RuleError
from onnxfuse.language import packs
from onnxfuse.language.guards import parse_guard
from onnxfuse.support import load_cache
from onnxfuse.targets.capabilities import load_target

RULE = relu_relu_rule("relu-relu", "Relu of a Relu is the inner Relu.")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(folder))
    monkeypatch.delenv("ONNXFUSE_NO_CACHE", raising=False)
    return folder


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.pickle")) if folder.exists() else []


def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the rule files parsed from here on."""
    seen: list[str] = []
    parse = packs.load_rule_file

    def counting(path, pack=""):
        seen.append(str(path))
        return parse(path, pack)

    monkeypatch.setattr(packs, "load_rule_file", counting)
    return seen


def test_builtin_rules_read_back_are_the_rules_loaded(cache, monkeypatch):
    monkeypatch.setenv("ONNXFUSE_NO_CACHE", "1")
    fresh = packs.load_builtin_packs()
    assert entries(cache) == []
    monkeypatch.delenv("ONNXFUSE_NO_CACHE")
    packs.load_builtin_packs()  # parses and keeps
    assert len(entries(cache)) == 1
    parsed = parses(monkeypatch)
    read_back = packs.load_builtin_packs()
    assert parsed == []
    assert [r.name for p in read_back for r in p.rules] == [r.name for p in fresh for r in p.rules]
    assert_same_structure(read_back, fresh)


def assert_same_structure(a: object, b: object, where: str = "packs", seen=None) -> None:
    """``a`` and ``b`` equal field by field, down to numbers, strings and arrays."""
    seen = {} if seen is None else seen
    assert type(a) is type(b), where
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert_same_structure(a[key], b[key], f"{where}[{key!r}]", seen)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_structure(x, y, f"{where}[{i}]", seen)
    elif isinstance(a, (set, frozenset)):
        assert a == b, where
    elif hasattr(a, "__dict__") or hasattr(type(a), "__slots__"):
        # Objects met again (shared, or in a cycle) are compared once; kept alive in
        # `seen` so that their ids stay theirs.
        if id(a) in seen:
            assert seen[id(a)][1] is b, f"{where}: shared differently"
            return
        seen[id(a)] = (a, b)
        assert_same_structure(fields(a), fields(b), f"{where}.", seen)
    else:
        assert a == b, where


def fields(value: object) -> dict[str, object]:
    found = dict(getattr(value, "__dict__", {}))
    for slot in getattr(type(value), "__slots__", ()):
        if hasattr(value, slot):
            found[slot] = getattr(value, slot)
    return found


def test_the_optimized_model_is_the_same_with_the_cache_cold_warm_and_off(tmp_path, cache):
    sample = api.sample_model_path()
    outputs = []
    for run, environment in enumerate([{}, {}, {"ONNXFUSE_NO_CACHE": "1"}]):
        out = tmp_path / f"out{run}.onnx"
        command = [sys.executable, "-m", "onnxfuse", "optimize", str(sample), "-o", str(out), "-q"]
        subprocess.run(command, check=True, env={**os.environ, **environment}, timeout=300)
        outputs.append(out.read_bytes())
        if run == 0:
            made = {p: p.stat().st_mtime_ns for p in entries(cache)}
            assert len(made) == 2  # the built-in rules and the cpu target
    assert outputs[0] == outputs[1] == outputs[2]
    assert {p: p.stat().st_mtime_ns for p in entries(cache)} == made  # read, not remade


def test_an_edited_rule_file_is_reparsed_even_with_its_size_and_time_unchanged(
    tmp_path, cache, monkeypatch
):
    rule_file = tmp_path / "mine.yaml"
    rule_file.write_text(RULE)
    before = rule_file.stat()
    assert [r.name for r in packs.load_rules([rule_file])] == ["relu-relu"]
    rule_file.write_text(RULE.replace("relu-relu", "relu-rel2"))
    os.utime(rule_file, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert rule_file.stat().st_size == before.st_size
    parsed = parses(monkeypatch)
    assert [r.name for r in packs.load_rules([rule_file])] == ["relu-rel2"]
    assert parsed == [str(rule_file)]


def test_a_pack_folder_gaining_a_file_is_reloaded(tmp_path, cache):
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / "a.yaml").write_text(RULE)
    assert [r.name for r in packs.load_rules([pack])] == ["relu-relu"]
    (pack / "b.yaml").write_text(RULE.replace("relu-relu", "relu-again"))
    assert [r.name for r in packs.load_rules([pack])] == ["relu-relu", "relu-again"]


def test_a_rule_file_with_an_error_fails_the_same_way_every_time_and_is_not_kept(tmp_path, cache):
    rule_file = tmp_path / "bad.yaml"
    rule_file.write_text(RULE.replace("Y = Relu(X)", "Y = Relu(X"))
    messages = []
    for _ in range(2):
        with pytest.raises(RuleError) as caught:
            packs.load_rules([rule_file])
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert "bad.yaml" in messages[0]
    assert entries(cache) == []
    missing = tmp_path / "missing.yaml"
    with pytest.raises(RuleError, match="no such rule file"):
        packs.load_rules([missing])


def test_a_damaged_entry_is_remade(tmp_path, cache, monkeypatch):
    rule_file = tmp_path / "mine.yaml"
    rule_file.write_text(RULE)
    packs.load_rules([rule_file])
    [entry] = entries(cache)
    entry.write_bytes(b"\x80\x05not a pickle")
    parsed = parses(monkeypatch)
    assert [r.name for r in packs.load_rules([rule_file])] == ["relu-relu"]
    assert parsed == [str(rule_file)]
    assert pickle.loads(entry.read_bytes())[0].rules[0].name == "relu-relu"


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_an_entry_others_could_write_is_not_read(tmp_path, cache, monkeypatch):
    rule_file = tmp_path / "mine.yaml"
    rule_file.write_text(RULE)
    packs.load_rules([rule_file])
    [entry] = entries(cache)
    entry.chmod(0o666)
    parsed = parses(monkeypatch)
    packs.load_rules([rule_file])
    assert parsed == [str(rule_file)]
    assert entry.stat().st_mode & 0o777 == 0o600  # remade by this user alone


def test_no_cache_writes_nothing(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("ONNXFUSE_NO_CACHE", "1")
    rule_file = tmp_path / "mine.yaml"
    rule_file.write_text(RULE)
    packs.load_rules([rule_file])
    assert not cache.exists()
    assert load_cache.cache_dir() is None


def test_a_cache_folder_that_cannot_be_made_does_not_stop_a_load(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ONNXFUSE_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("ONNXFUSE_NO_CACHE", raising=False)
    rule_file = tmp_path / "mine.yaml"
    rule_file.write_text(RULE)
    assert [r.name for r in packs.load_rules([rule_file])] == ["relu-relu"]
    assert [r.name for r in packs.load_rules([rule_file])] == ["relu-relu"]


def test_the_default_folder_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("ONNXFUSE_CACHE_DIR", raising=False)
    monkeypatch.delenv("ONNXFUSE_NO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert load_cache.cache_dir() == tmp_path / "onnxfuse"


def test_old_entries_are_pruned_without_pushing_out_the_builtin_rules(tmp_path, cache):
    packs.load_builtin_packs(["core"])
    for number in range(load_cache._KEEP + 3):
        rule_file = tmp_path / f"r{number}.yaml"
        rule_file.write_text(RULE.replace("relu-relu", f"relu-{number}"))
        packs.load_rules([rule_file])
    assert len(list(cache.glob("rules-*.pickle"))) == load_cache._KEEP
    assert len(list(cache.glob("builtin-rules-*.pickle"))) == 1


def test_an_edited_target_file_is_reparsed(tmp_path, cache):
    source = Path(str(packs.resources.files("onnxfuse.builtin_targets") / "cpu.yaml"))
    text = source.read_text()
    mine = tmp_path / "mine.yaml"
    mine.write_text(text.replace("name: cpu", "name: mine-a", 1))
    assert load_target(str(mine)).name == "mine-a"
    load_target.cache_clear()  # the in-process memo; the disk cache is what is tested
    mine.write_text(text.replace("name: cpu", "name: mine-b", 1))
    try:
        assert load_target(str(mine)).name == "mine-b"
    finally:
        load_target.cache_clear()
    assert len(entries(cache)) == 2


def structure_description(node) -> tuple:
    """What a pattern node requires below it, written out in full (no numbers)."""
    orders = []
    for order in node.input_orders:
        needs = []
        for position, value in enumerate(order):
            if value is None or value.kind == "input":
                continue
            below = None if value.producer is None else structure_description(value.producer)
            needs.append((position, below, value.output_index))
        orders.append(tuple(needs))
    return (node.domain, node.op_type, tuple(orders))


def builtin_pattern_nodes() -> list:
    return [
        node
        for pack in packs.load_builtin_packs()
        for rule in pack.rules
        for source in rule.sources
        for node in source.nodes
    ]


def test_structure_numbers_name_structures_one_to_one(cache):
    numbers: dict[tuple, int] = {}
    for node in builtin_pattern_nodes():
        numbers.setdefault(structure_description(node), node.structure[0])
        assert numbers[structure_description(node)] == node.structure[0]
    assert len(set(numbers.values())) == len(numbers)  # distinct structures, distinct numbers
    assert len(numbers) > 100


def test_rules_read_back_carry_the_structure_numbers_every_process_computes(cache):
    packs.load_builtin_packs()  # kept
    read_back = builtin_pattern_nodes()
    assert all("structure" in vars(node) for node in read_back)  # not computed again
    kept = [node.structure[0] for node in read_back]
    program = (
        "import json\n"
        "from onnxfuse.language import packs\n"
        "print(json.dumps([n.structure[0] for p in packs.load_builtin_packs() for r in p.rules"
        " for s in r.sources for n in s.nodes]))"
    )
    other = subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, "ONNXFUSE_NO_CACHE": "1", "PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert json.loads(other.stdout) == kept


def test_a_guard_already_evaluated_still_pickles_and_evaluates_alike():
    guard = parse_guard("len(perm) == 2 and perm[0] == 1", {"perm"})
    assert guard.evaluate({"perm": [1, 0]}) is True
    read_back = pickle.loads(pickle.dumps(guard))
    assert "_compiled" not in vars(read_back)
    assert read_back.evaluate({"perm": [1, 0]}) is True
    assert read_back.evaluate({"perm": [0, 1]}) is False


def test_a_rule_file_edited_while_it_loads_is_not_kept(tmp_path, cache, monkeypatch):
    rule_file = tmp_path / "mine.yaml"
    rule_file.write_text(RULE)
    parse = packs.load_rule_file

    def parse_then_edit(path, pack=""):
        rules = parse(path, pack)
        Path(path).write_text(RULE.replace("relu-relu", "relu-edit"))
        return rules

    monkeypatch.setattr(packs, "load_rule_file", parse_then_edit)
    assert [r.name for r in packs.load_rules([rule_file])] == ["relu-relu"]
    assert entries(cache) == []  # what was parsed is no longer what the file holds


def test_a_target_file_with_windows_line_ends_loads_as_with_unix_ones(tmp_path, cache):
    source = Path(str(packs.resources.files("onnxfuse.builtin_targets") / "cpu.yaml"))
    text = source.read_text().replace("name: cpu", "name: crlf", 1)
    unix, windows = tmp_path / "unix.yaml", tmp_path / "windows.yaml"
    unix.write_bytes(text.encode())
    windows.write_bytes(text.replace("\n", "\r\n").encode())
    try:
        a, b = load_target(str(unix)), load_target(str(windows))
        assert a.name == b.name == "crlf"
        assert a.ops == b.ops
    finally:
        load_target.cache_clear()


def test_a_load_from_the_cache_imports_no_yaml_parser(cache):
    script = (
        "import json, sys\n"
        "from onnxfuse.api import select_rules\n"
        "from onnxfuse.targets.capabilities import load_target\n"
        "rules, target = select_rules(), load_target('cpu')\n"
        "print(json.dumps([len(rules), 'yaml' in sys.modules]))\n"
    )
    found = []
    for _ in range(2):  # the first fills the cache, the second reads it
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        found.append(json.loads(done.stdout))
    assert found[0][1] and found[0][0] == found[1][0] > 200
    assert not found[1][1]
