"""The stack file reader: stack names, the YAML it accepts, the provider keys it knows, and properties over any file.

The property: whatever a stack file holds, ``load_stack`` returns a StackConfig or raises ConfigError with one line;
a StackConfig it returns renders every kind for every team (or says in one line why a job cannot run)."""

from __future__ import annotations

import copy
import importlib.util
import inspect
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuyard.infra.config import ConfigError, load_stack, stacks_dir
from gpuyard.infra.stack_file import PROVIDER_KEYS, STACK_NAME, StackFileError, StackFileLoader, check_stack_name
from gpuyard.jobs.render import default_specs, render_specs
from gpuyard.jobs.spec import SpecError

REPO = Path(__file__).resolve().parent.parent
DEV = (REPO / "stacks" / "Pulumi.dev.yaml").read_text()
DOCUMENT = yaml.safe_load(DEV)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_the_aws_keys_are_the_providers():
    """pulumi_aws reads exactly these keys of the `aws:` namespace (config/vars.py of the installed SDK)."""
    source = (Path(importlib.util.find_spec("pulumi_aws").origin).parent / "config" / "vars.py").read_text()
    read = set(re.findall(r"__config__\.get(?:_bool|_int|_float|_object)?\('(\w+)'\)", source))
    assert read == set(PROVIDER_KEYS["aws"])


def test_the_kubernetes_keys_are_the_providers():
    from pulumi_kubernetes.provider import ProviderArgs

    def camel(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(part.capitalize() for part in rest)

    arguments = [name for name in inspect.signature(ProviderArgs.__init__).parameters if not name.startswith("_")]
    assert {camel(name) for name in arguments} == set(PROVIDER_KEYS["kubernetes"])


@given(st.text(max_size=80))
def test_a_stack_name_is_a_name_never_a_path(text):
    try:
        name = check_stack_name(text)
    except StackFileError as error:
        assert "\n" not in str(error) and "bad stack name" in str(error)
        return
    assert name == text and STACK_NAME.fullmatch(name) and "/" not in name and name not in (".", "..")
    assert (Path("/cache/state") / name).parent == Path("/cache/state") and len(name) <= 63


@pytest.mark.parametrize("text, value", [
    ("a: 1_0", "1_0"), ("a: 010", 10), ("a: 0o17", 15), ("a: 0x1f", 31), ("a: 1:30", "1:30"), ("a: yes", "yes"),
    ("a: no", "no"), ("a: on", "on"), ("a: True", True), ("a: 2026-01-01", "2026-01-01"), ("a: 1e3", 1000.0),
    ("a: ~", None), ("a:", None), ("a: '8'", "8"), ("a: -3", -3), ("a: .5", 0.5), ("a: =", "="),
])
def test_scalars_read_as_yaml_1_2_core_as_pulumi_reads_them(text, value):
    assert yaml.load(text, Loader=StackFileLoader) == {"a": value}


def test_merge_keys_override_and_an_alias_is_a_copy():
    text = "base: &b {x: 1, y: [1, 2]}\nc: {<<: *b, y: 3}\nd: *b\n"
    assert yaml.load(text, Loader=StackFileLoader) == {"base": {"x": 1, "y": [1, 2]}, "c": {"x": 1, "y": 3},
                                                        "d": {"x": 1, "y": [1, 2]}}


def _stack(tmp_path: Path, text: str | bytes) -> Path:
    folder = tmp_path / "stacks"
    folder.mkdir(exist_ok=True)
    (folder / "Pulumi.prop.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


def _loads_or_says_why_in_one_line(folder: Path) -> None:
    try:
        config = load_stack("prop", folder)
    except ConfigError as error:
        assert "\n" not in str(error) and str(error).strip(), repr(str(error))
        return
    try:
        render_specs(config, default_specs(config))
    except (ConfigError, SpecError, ValueError) as error:
        assert "\n" not in str(error), repr(str(error))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _paths(inner, (*prefix, index))


PATHS = [path for path in _paths(DOCUMENT["config"]) if path]


@SETTINGS
@given(path=st.sampled_from(PATHS), value=JSON_VALUES)
def test_any_value_at_any_key_loads_or_is_one_line(tmp_path, path, value):
    config = copy.deepcopy(DOCUMENT["config"])
    holder = config
    for part in path[:-1]:
        holder = holder[part]
    holder[path[-1]] = value
    _loads_or_says_why_in_one_line(_stack(tmp_path, yaml.safe_dump({"config": config}, allow_unicode=True)))


@SETTINGS
@given(key=st.text(max_size=20), value=JSON_VALUES, nested=st.sampled_from([None, *[p for p in PATHS if len(p) == 1]]))
def test_any_extra_key_loads_or_is_one_line(tmp_path, key, value, nested):
    config = copy.deepcopy(DOCUMENT["config"])
    target = config if nested is None or not isinstance(config[nested[0]], dict) else config[nested[0]]
    target[key] = value
    _loads_or_says_why_in_one_line(_stack(tmp_path, yaml.safe_dump({"config": config}, allow_unicode=True)))


@SETTINGS
@given(st.data())
def test_any_edit_of_the_text_loads_or_is_one_line(tmp_path, data):
    """Characters inserted, deleted or replaced anywhere in a real stack file, YAML's own punctuation included."""
    text = DEV
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 8))
        insert = data.draw(st.text(alphabet=st.sampled_from(list("&*<:-[]{}!|>'\"#%@ \n\t,?~.0123456789abctruefalsn")),
                                   max_size=12))
        text = text[:at] + insert + text[at + cut:]
    _loads_or_says_why_in_one_line(_stack(tmp_path, text))


@SETTINGS
@given(st.binary(max_size=300))
def test_any_bytes_load_or_are_one_line(tmp_path, data):
    _loads_or_says_why_in_one_line(_stack(tmp_path, data))


def test_the_real_stacks_load():
    for path in stacks_dir().glob("Pulumi.*.yaml"):
        load_stack(path.name[len("Pulumi."):-len(".yaml")])
