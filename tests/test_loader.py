"""The YAML loader: limits, YAML 1.2 scalars, refused constructs, libyaml and pure Python alike.

Every refusal is one InputError naming the file and the line; nothing here may hang, recurse
without bound or leak a PyYAML traceback.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from simulator.errors import InputError
from simulator.inputs import loader
from simulator.inputs.config import load_topology, load_workload, preset_dir, preset_names
from simulator.inputs.loader import decode, load_yaml, resolve_plain

BOMB = "\n".join(['a: &a ["x","x","x","x","x","x","x","x","x"]']
                 + [f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]"
                    for p, n in zip("abcdefgh", "bcdefghi", strict=True)])

# (what, YAML text, line of the error, words in the message)
REFUSED = [
    ("alias bomb", BOMB, None, "alias bomb"),
    ("recursive alias", "name: &x\n  a: *x\n", 2, "recursive"),
    ("recursive list", "a: &x [1, *x]\n", 1, "recursive"),
    ("undefined alias", "a: 1\nb: *nope\n", 2, "*nope"),
    ("custom tag", "name: !foo bar\n", 1, "'!foo'"),
    ("python tag", "name: !!python/object:os.system x\n", 1, "unsupported YAML tag"),
    ("timestamp tag", "name: !!timestamp 2001-12-14\n", 1, "unsupported YAML tag"),
    ("set tag", "a: !!set {x: null}\n", 1, "unsupported YAML tag"),
    ("bad float", "a: !!float xyz\n", 1, "!!float 'xyz' is not a valid float"),
    ("bad int", "a: !!int 1.5\n", 1, "!!int '1.5'"),
    ("merge key", "base: &b {x: 1}\nother:\n  <<: *b\n", 3, "merge keys"),
    ("complex key", "? [a, b]\n: 1\n", 1, "plain text"),
    ("alias as key", "a: &k x\n*k : 1\n", 2, "plain text"),
    ("duplicate key", "gpu: rtx5090\np2p: false\ngpu: h100-sxm\n", 3, "first on line 1"),
    ("duplicate nested key", "a:\n  b: 1\n  b: 2\n", 3, "'b' is given twice"),
    ("two documents", "a: 1\n---\nb: 2\n", 2, "more than one YAML document"),
    ("too deep", "a: " + "[" * 40 + "]" * 40 + "\n", 1, "levels deep"),
    ("bad syntax", "a: [1, 2\nb: 3\n", 2, "invalid YAML"),
    ("control character", "a: \x07\n", 1, "invalid YAML"),
]


@pytest.mark.parametrize(("what", "text", "line", "words"), REFUSED, ids=[c[0] for c in REFUSED])
@pytest.mark.parametrize("parser", [None, yaml.SafeLoader], ids=["libyaml", "python"])
def test_refused_with_file_and_line(what: str, text: str, line: int | None, words: str,
                                    parser: type | None) -> None:
    started = time.perf_counter()
    with pytest.raises(InputError) as info:
        load_yaml(text, "in.yaml", parser_class=parser)
    err = info.value
    assert err.file == "in.yaml" and words in err.message, (what, str(err))
    if line is not None:
        assert err.line == line, (what, str(err))
    assert "\n" not in str(err)
    assert time.perf_counter() - started < 2.0, what


@pytest.mark.parametrize("parser", [None, yaml.SafeLoader], ids=["libyaml", "python"])
def test_deep_nesting_beyond_pythons_recursion_limit_is_refused(parser: type | None) -> None:
    # libyaml stops at its own nesting limit, the pure-Python parser at ours
    with pytest.raises(InputError, match="deep|depth"):
        load_yaml("[" * 100_000 + "]" * 100_000, "deep.yaml", parser_class=parser)


def test_non_utf8_names_the_line_of_the_bad_byte() -> None:
    with pytest.raises(InputError) as info:
        decode(b"name: ok\nsource: caf\xe9\n", "latin1.yaml")
    assert info.value.line == 2 and "0xe9" in info.value.message
    assert decode(b"\xef\xbb\xbfname: bom\n", "bom.yaml") == "name: bom\n"


def test_oversized_file_is_refused_before_parsing() -> None:
    with pytest.raises(InputError, match="at most"):
        decode(b" " * (loader.MAX_BYTES + 1), "big.yaml")


# YAML 1.2 core schema: what a plain scalar becomes
SCALARS = [
    ("1e9", 1e9), ("25", 25), ("-3", -3), ("010", 10), ("0x1F", 31), ("0o17", 15),
    ("1_000_000", 1_000_000), ("2.5", 2.5), (".5", 0.5), ("1.", 1.0), ("-.inf", -math.inf),
    ("true", True), ("False", False), ("~", None), ("null", None), ("", None),
    # YAML 1.1 read these as booleans, base-60 numbers or dates; YAML 1.2 (and stepsim) as text
    ("on", "on"), ("yes", "yes"), ("No", "No"), ("1:30", "1:30"), ("2001-12-14", "2001-12-14"),
    ("1e", "1e"), ("0x", "0x"), ("9" * 5000, "9" * 5000),
]


@pytest.mark.parametrize(("text", "value"), SCALARS)
def test_plain_scalars_follow_yaml_1_2(text: str, value: object) -> None:
    got = resolve_plain(text)
    assert got == value and type(got) is type(value)


def test_nan_is_a_float() -> None:
    assert math.isnan(resolve_plain(".nan"))


@given(st.floats(allow_nan=False, allow_infinity=False) | st.integers())
def test_numbers_round_trip_as_python_writes_them(x: float) -> None:
    assert resolve_plain(repr(x)) == x


def test_quoted_and_tagged_scalars_stay_text() -> None:
    data, _ = load_yaml("a: '25'\nb: !!str 1e9\nc: \"on\"\nd: !!float 3\n", "q.yaml")
    assert data == {"a": "25", "b": "1e9", "c": "on", "d": 3.0}


def test_lines_of_keys_and_alias_values() -> None:
    text = "base: &b {lanes: 16}\nlinks:\n  - a: x\n    lanes: 8\n  - *b\n"
    data, lines = load_yaml(text, "l.yaml")
    assert data["links"][1] == {"lanes": 16}
    assert lines[("links", 0, "lanes")] == 4
    assert lines[("links", 1)] == 5  # an error inside the alias's value names the alias line


@pytest.mark.parametrize("kind", ["topologies", "workloads"])
def test_libyaml_and_pure_python_read_every_preset_alike(kind: str) -> None:
    for name in preset_names(kind):
        text = (preset_dir(kind) / f"{name}.yaml").read_text()
        fast = load_yaml(text, name)
        slow = load_yaml(text, name, parser_class=yaml.SafeLoader)
        assert fast == slow, name
        assert fast[0] == yaml.safe_load(text), name  # the presets use no YAML 1.1 quirks


def test_yaml_1_1_boolean_is_not_a_link_width(tmp_path: Path) -> None:
    text = (preset_dir("topologies") / "2x5090.yaml").read_text()
    for bad, words in (("lanes: on", "YAML 1.1"),):
        path = tmp_path / "t.yaml"
        path.write_text(text.replace("lanes: 16", bad, 1))
        with pytest.raises(InputError) as info:
            load_topology(str(path))
        assert info.value.key == "links[0].lanes" and words in str(info.value), str(info.value)


def test_long_values_are_cut_in_messages(tmp_path: Path) -> None:
    text = (preset_dir("workloads") / "gpt2-medium.yaml").read_text()
    path = tmp_path / "w.yaml"
    path.write_text(text.replace("attention: eager", "attention: " + "x" * 4000, 1))
    with pytest.raises(InputError) as info:
        load_workload(str(path))
    assert len(str(info.value)) < 300 and "..." in str(info.value)
