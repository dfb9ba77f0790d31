"""Reading a ``Pulumi.<stack>.yaml`` strictly: a valid stack name, one YAML mapping, no duplicate keys, known keys.

Pulumi itself keeps the last of two equal keys and ignores config of a namespace nobody reads, so a
mistyped key would silently change nothing; here both are errors naming the key as written.

The YAML is read as Pulumi reads it (go-yaml v3, YAML 1.2's core schema): ``true``/``false`` only are booleans,
``1_0``, ``010`` and ``1:30`` are not numbers in disguise, timestamps stay text. Anchors and merge keys work;
aliases may expand the document to at most ``MAX_EXPANDED_NODES`` nodes (go-yaml v3 refuses "excessive
aliasing" likewise, decode.go ``allowedAliasRatio``), so a few hundred bytes cannot become gigabytes.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, SequenceNode

# Namespaces a stack file may configure: ours and the providers the program uses.
NAMESPACES = ("gpuyard", "aws", "kubernetes", "pulumi")
REQUIRED_KEYS = ("aws:region", "gpuyard:cluster_name", "gpuyard:teams")
TOP_LEVEL_KEYS = ("config", "secretsprovider", "encryptedkey", "encryptionsalt", "environment")
# The provider configuration keys of the SDKs the program runs with: pulumi_aws 7.x ``config/vars.py`` and
# pulumi_kubernetes 4.x ``ProviderArgs`` (tests/test_infra_stack_file.py checks both against the installed SDKs);
# Pulumi's own project keys (pulumi/pulumi, sdk/go/common/resource/config: ``pulumi:tags``,
# ``pulumi:disable-default-providers``).
PROVIDER_KEYS = {
    "aws": (
        "accessKey", "allowedAccountIds", "assumeRoleWithWebIdentity", "assumeRoles", "customCaBundle", "defaultTags",
        "ec2MetadataServiceEndpoint", "ec2MetadataServiceEndpointMode", "endpoints", "forbiddenAccountIds",
        "httpProxy", "httpsProxy", "ignoreTags", "insecure", "maxRetries", "noProxy", "profile", "region",
        "retryMode", "s3UsEast1RegionalEndpoint", "s3UsePathStyle", "secretKey", "sharedConfigFiles",
        "sharedCredentialsFiles", "skipCredentialsValidation", "skipMetadataApiCheck", "skipRegionValidation",
        "skipRequestingAccountId", "stsRegion", "tagPolicyCompliance", "token", "tokenBucketRateLimiterCapacity",
        "useDualstackEndpoint", "useFipsEndpoint", "userAgents",
    ),
    "kubernetes": (
        "alwaysRender", "cluster", "clusterIdentifier", "context", "deleteUnreachable", "enableConfigMapMutable",
        "enablePatchForce", "enableSecretMutable", "enableServerSideApply", "helmReleaseSettings",
        "kubeClientSettings", "kubeconfig", "namespace", "renderYamlToDirectory", "skipUpdateUnreachable",
        "suppressDeprecationWarnings", "suppressHelmHookWarnings", "upsertExistingObjects",
    ),
    "pulumi": ("tags", "disable-default-providers"),
}
# A stack's name is a file name (Pulumi.<name>.yaml), a folder of `gpuyard sim` and part of the cluster's names:
# one DNS-1123 label, so it can never be a path ("..", "/x", "") or anything a shell or Kubernetes reads otherwise.
STACK_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
STACK_NAME_RULE = "lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63"
MAX_FILE_BYTES = 1 << 20
MAX_EXPANDED_NODES = 100_000

_MERGE = "tag:yaml.org,2002:merge"
_CORE_SCHEMA = {  # YAML 1.2 core schema (yaml.org/spec/1.2.2, 10.3.2 Tag Resolution)
    "tag:yaml.org,2002:null": r"~|null|Null|NULL|",
    "tag:yaml.org,2002:bool": r"true|True|TRUE|false|False|FALSE",
    "tag:yaml.org,2002:int": r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+",
    "tag:yaml.org,2002:float": (r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?"
                                 r"|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)"),
}
_NOT_CONFIG = ("timestamp", "binary", "set", "omap", "pairs")  # YAML types no Pulumi config value has


class StackFileError(ValueError):
    """A stack file that is not a stack file, as one line."""


def check_stack_name(name: object) -> str:
    """``name`` if it is a valid stack name, else a StackFileError saying the rule."""
    if not isinstance(name, str) or not STACK_NAME.fullmatch(name):
        raise StackFileError(f"bad stack name {name!r}: {STACK_NAME_RULE}")
    return name


def _core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    base = {"0o": 8, "0x": 16}.get(text[:2], 10)
    return int(text[2:] if base != 10 else text, base)


def _refuse(loader: yaml.SafeLoader, node: Node) -> None:
    raise ConstructorError(None, None, f"the YAML tag {node.tag.replace('tag:yaml.org,2002:', '!!')} is not a config "
                           "value (text, numbers, true/false, lists and mappings)", node.start_mark)


class StackFileLoader(yaml.SafeLoader):
    """SafeLoader reading YAML 1.2's core schema; refuses duplicate or unhashable keys and excessive aliasing."""

    yaml_implicit_resolvers: dict = {}

    def compose_document(self) -> Node:
        node = super().compose_document()
        _check_expansion(node)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                raise ConstructorError(None, None, f"a {key_node.id} cannot be a key "
                                       f"(line {key_node.start_mark.line + 1})", key_node.start_mark) from None
            if duplicate:
                raise ConstructorError(None, None, f"duplicate key {key!r} (line {key_node.start_mark.line + 1})",
                                       key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


for _tag, _pattern in _CORE_SCHEMA.items():
    StackFileLoader.add_implicit_resolver(_tag, re.compile(f"^(?:{_pattern})$"), list("-+0123456789.~ntfNTF") + [""])
StackFileLoader.add_implicit_resolver(_MERGE, re.compile(r"^(?:<<)$"), ["<"])
StackFileLoader.add_constructor("tag:yaml.org,2002:int", _core_int)
for _name in _NOT_CONFIG:
    StackFileLoader.add_constructor(f"tag:yaml.org,2002:{_name}", _refuse)


def _check_expansion(root: Node | None) -> None:
    """Refuse a document whose aliases expand to more than MAX_EXPANDED_NODES nodes, or refer to themselves."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    pending: list[tuple[Node, bool]] = [(root, False)] if root is not None else []
    while pending:
        node, finished = pending.pop()
        children = _children(node)
        if finished:
            on_path.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[id(node)] > MAX_EXPANDED_NODES:
                raise ConstructorError(None, None, f"aliases expand this document beyond {MAX_EXPANDED_NODES:,} "
                                       "values (an alias bomb?)", node.start_mark)
        elif id(node) not in sizes:
            if id(node) in on_path:
                raise ConstructorError(None, None, "an alias refers to a node that contains it", node.start_mark)
            on_path.add(id(node))
            pending.append((node, True))
            pending.extend((child, False) for child in children)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _suggest(word: str, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _described(document: Any) -> str:
    """What a YAML document is, in YAML's words."""
    if document is None:
        return "an empty document"
    kinds = ((bool, "true/false"), ((int, float), "a number"), (str, "text"), (list, "a list"))
    return next((name for kind, name in kinds if isinstance(document, kind)), "something else")


def load_yaml(path: Path) -> Any:
    """The YAML document of ``path`` (a regular file of at most MAX_FILE_BYTES), read with StackFileLoader."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise StackFileError(f"{path}: cannot read it ({error.strerror or error})") from None
    if len(data) > MAX_FILE_BYTES:
        raise StackFileError(f"{path}: larger than {MAX_FILE_BYTES // 1024} KiB: not a stack file")
    try:
        return yaml.load(data.decode("utf-8"), Loader=StackFileLoader)
    except UnicodeDecodeError as error:
        raise StackFileError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except yaml.YAMLError as error:
        raise StackFileError(f"{path}: not valid YAML ({' '.join(str(error).split())})") from None
    except RecursionError:
        raise StackFileError(f"{path}: nested too deeply to be a stack file") from None


def read_config(path: Path) -> dict[str, Any]:
    """The ``config:`` mapping of a stack file, checked for shape, namespaces, provider keys and required keys."""
    document = load_yaml(path)
    if not isinstance(document, dict):
        raise StackFileError(f"{path}: expected a mapping with a 'config:' key, got {_described(document)}")
    unknown = sorted((key for key in document if key not in TOP_LEVEL_KEYS), key=str)
    if unknown:
        raise StackFileError(f"{path}: unknown top-level key {unknown[0]!r} (stack settings go under 'config:')")
    config = document.get("config")
    if not isinstance(config, dict):
        raise StackFileError(f"{path}: 'config:' must be a mapping of namespace:key settings")
    for key in config:
        if not isinstance(key, str):
            raise StackFileError(f"{path}: config key {key!r} is not text (write namespace:key, e.g. gpuyard:teams)")
        namespace, colon, name = key.partition(":")
        if not colon:
            raise StackFileError(f"{path}: config key {key!r} has no namespace (write {'gpuyard:' + key!r})")
        if namespace not in NAMESPACES:
            raise StackFileError(f"{path}: unknown namespace in {key!r}{_suggest(namespace, NAMESPACES)}")
        known = PROVIDER_KEYS.get(namespace)
        if known is not None and name not in known:
            raise StackFileError(f"{path}: unknown key {key!r}{_suggest(name, known)}")
    missing = [key for key in REQUIRED_KEYS if key not in config]
    if missing:
        raise StackFileError(f"{path}: missing {missing[0]}")
    return config
