"""to_yaml writes what PyYAML reads back unchanged, in block style, never folding a long line."""

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuyard.jobs.render import to_yaml

TRICKY = ["", " ", "true", "no", "on", "null", "~", "1", "0.5", "1e3", "0x1f", "1:30", "2:8", ".inf", "=", "<<",
          "-", "- x", "--nnodes=2", "a: b", "a:", "a #b", "a#b", "#c", "'q'", '"d"', "x'y", "---", "...", "@x",
          "*ref", "&anchor", "!tag", "|", ">", "%p", "?", "[a]", "{a}", "a, b", "tab\there", "line\nbreak",
          "nel\x85", "ls\u2028", "bom\ufeff", "émoji 🚀", "\x00", "trailing ", " leading", "2026-12-02",
          "s3://bucket/teams/a", "karpenter.sh/do-not-disrupt", "127.0.0.1:29400"]
SCALARS = st.one_of(st.text(max_size=40), st.sampled_from(TRICKY), st.integers(), st.booleans(), st.none())
KEYS = st.one_of(st.text(max_size=30), st.sampled_from(TRICKY))
DOCUMENTS = st.dictionaries(KEYS, st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)), max_leaves=30), max_size=4)


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_strings_round_trip(text):
    assert yaml.safe_load(to_yaml({text: [text, {text: text}]})) == {text: [text, {text: text}]}


@settings(max_examples=300, deadline=None)
@given(DOCUMENTS)
def test_any_document_round_trips(document):
    assert yaml.safe_load(to_yaml(document)) == document


def test_layout_is_block_style_in_insertion_order():
    document = {"spec": {"containers": [{"name": "a", "args": ["-m", "x"], "env": []}], "plugins": {"svc": []}}}
    assert to_yaml(document) == (
        "spec:\n"
        "  containers:\n"
        "  - name: a\n"
        "    args:\n"
        "    - -m\n"
        "    - x\n"
        "    env: []\n"
        "  plugins:\n"
        "    svc: []\n"
    )


def test_long_strings_stay_on_one_line():
    command = "mpirun " + " ".join(f"-x VAR{i}=value{i}" for i in range(40))
    assert to_yaml({"command": command}) == f"command: {command}\n"
