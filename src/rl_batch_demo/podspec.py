"""What every episode's pod is given beside its program (--cpu, --memory, --env, --env-from-secret,
--allow-egress): the flags read and checked into an EpisodePod, and the objects it adds to a run
(a Secret's copy, the NetworkPolicy that lets the pods out)."""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Any, Callable, Iterable, Sequence

from .constants import ANNOTATION_PREFIX, EPISODE_TIMEOUT_ENV, TASK_FILE_ENV
from .model import (
    COMMAND_LINE,
    DemoError,
    EgressTarget,
    EpisodePod,
    RunRequest,
    SecretSource,
    Spelling,
    UsageError,
)
from .manifests import parse_quantity

# The environment the tool sets itself: --env may not replace it (nor may a Secret's keys: the
# kubelet lets `env` win over `envFrom`).
RESERVED_ENV = (
    "EPISODE_ID",
    "EPISODE_INDEX",
    "EPISODE_INDEXES",
    TASK_FILE_ENV,
    EPISODE_TIMEOUT_ENV,
)

# An environment variable's name as every supported API server takes it (1.34 relaxed the rule).
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")

# A Secret's name (a DNS subdomain) and a namespace's (a DNS label).
SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")

HOST_NAME = re.compile(
    r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*\.?"
)

# A quantity as the API server writes one: a number and a suffix (decimal SI, binary, or exponent).
QUANTITY = re.compile(r"(\d+(\.\d*)?|\.\d+)([kMGTPE]|[KMGTPE]i|m|[eE][+-]?\d+)?")

# A Secret copied into the run's namespace names its source here ("NAMESPACE/NAME").
COPIED_FROM_ANNOTATION = ANNOTATION_PREFIX + "copied-from"

EGRESS_POLICY = "allow-egress"


def quantity(text: str, resource: str) -> str:
    """One CPU or memory quantity, positive and as the API server takes it; ValueError says why."""
    if not QUANTITY.fullmatch(text):
        example = "500m or 2" if resource == "cpu" else "256Mi or 1Gi"
        raise ValueError(f"{text!r} is not a quantity (e.g. {example})")
    if resource == "memory" and text.endswith("m"):
        # 128m is 0.128 bytes to Kubernetes: no container starts with it.
        raise ValueError(
            f"{text!r} is {text[:-1]} thousandths of a byte; did you mean {text[:-1]}Mi?"
        )
    if resource == "cpu" and text.endswith("i"):
        raise ValueError(f"{text!r}: CPU is counted in cores (e.g. 2) or millicores (500m)")
    if not parse_quantity(text):
        raise ValueError(f"{text!r} must be more than 0")
    return text


def resource_pair(text: str, resource: str) -> tuple[str, str]:
    """--cpu/--memory: Q (request and limit both Q), or REQUEST:LIMIT; ValueError says why."""
    request, split, limit = text.partition(":")
    request, limit = quantity(request, resource), quantity(limit if split else request, resource)
    if (parse_quantity(request) or 0) > (parse_quantity(limit) or 0):
        raise ValueError(f"the request {request} is over the limit {limit}")
    return request, limit


def env_pairs(texts: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """--env KEY=VALUE, each KEY once and none the tool sets itself; ValueError says why."""
    pairs: dict[str, str] = {}
    for text in texts:
        key, split, value = text.partition("=")
        if not split:
            raise ValueError(f"{text!r} is not KEY=VALUE")
        if not ENV_NAME.fullmatch(key):
            raise ValueError(
                f"{key!r} is not an environment variable's name ([-._a-zA-Z][-._a-zA-Z0-9]*)"
            )
        if key in RESERVED_ENV:
            raise ValueError(f"{key} is set by the tool for every episode")
        if key in pairs:
            raise ValueError(f"{key} is given twice")
        pairs[key] = value
    return tuple(pairs.items())


def secret_sources(texts: Iterable[str]) -> tuple[SecretSource, ...]:
    """--env-from-secret [NAMESPACE/]NAME, each name once (its copy in the run's namespace keeps it)."""
    sources: dict[str, SecretSource] = {}
    for text in texts:
        namespace, split, name = text.rpartition("/")
        if not SECRET_NAME.fullmatch(name) or len(name) > 253:
            raise ValueError(f"{name!r} is not a Secret's name")
        if split and (not NAMESPACE_NAME.fullmatch(namespace) or len(namespace) > 63):
            raise ValueError(f"{namespace!r} is not a namespace's name")
        if name in sources:
            raise ValueError(
                f"two Secrets named {name}: their copies would share the run's namespace"
            )
        sources[name] = SecretSource(name, namespace or None)
    return tuple(sources.values())


def egress_target(text: str) -> EgressTarget:
    """--allow-egress CIDR (every port), IP:PORT or HOST:PORT (TCP; a HOST resolved later, by
    resolve_egress); ValueError says why."""
    if "/" in text:
        try:
            return EgressTarget(text, (str(ipaddress.ip_network(text, strict=False)),))
        except ValueError:
            raise ValueError(f"{text!r} is not a CIDR (e.g. 10.0.0.0/8)") from None
    host, split, port = text.rpartition(":")
    if not split or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is neither HOST:PORT (e.g. api.example.com:443) nor a CIDR")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if not HOST_NAME.fullmatch(host):
            raise ValueError(f"{host!r} is not a host name or an IP address") from None
        return EgressTarget(text, (), int(port), host.rstrip("."))
    return EgressTarget(text, (str(ipaddress.ip_network(address)),), int(port))


def episode_pod(request: RunRequest) -> EpisodePod:
    """The request's pod settings, checked (a HOST of --allow-egress not yet resolved); UsageError
    names the setting as the caller wrote it."""
    parts: dict[str, Any] = {}
    for name in ("cpu", "memory"):
        given = getattr(request, name)
        try:
            if given is not None:
                parts[name] = resource_pair(given, name)
        except ValueError as error:
            raise UsageError(f"{request.spelling.setting(name, given)}: {error}") from None
    for name, dest, read in (
        ("env", "env", env_pairs),
        ("secrets", "env_from_secret", secret_sources),
        ("egress", "allow_egress", lambda texts: tuple(map(egress_target, texts))),
    ):
        try:
            parts[name] = read(getattr(request, dest))
        except ValueError as error:
            raise UsageError(f"{request.spelling.name(dest)}: {error}") from None
    if parts["egress"] and not request.harden:
        raise UsageError(
            f"{request.spelling.name('allow_egress')} needs {request.spelling.switch('harden')}: "
            f"without it nothing is denied, so there is nothing to allow"
        )
    return EpisodePod(**parts)


Resolver = Callable[..., Sequence[Any]]


def resolve_egress(
    pod: EpisodePod, spelling: Spelling = COMMAND_LINE, resolver: Resolver = socket.getaddrinfo
) -> EpisodePod:
    """Each HOST of --allow-egress as its addresses now, from this machine (a NetworkPolicy holds
    addresses, never names); DemoError names a host that does not resolve."""
    targets = []
    for target in pod.egress:
        if target.host is None or target.cidrs:
            targets.append(target)
            continue
        try:
            found = resolver(target.host, target.port, type=socket.SOCK_STREAM)
        except OSError as error:
            raise DemoError(
                f"{spelling.setting('allow_egress', target.given)}: cannot resolve {target.host} from this machine "
                f"({error}); give its addresses as a CIDR instead"
            ) from None
        addresses = sorted({str(ipaddress.ip_network(entry[4][0])) for entry in found})
        targets.append(target._replace(cidrs=tuple(addresses)))
    return pod._replace(egress=tuple(targets))


def egress_policy_manifest(namespace: str, targets: Sequence[EgressTarget]) -> dict:
    """Besides --harden's deny-all, the only egress the episodes' pods have: each target's
    addresses, on its TCP port (a CIDR's: every port). NetworkPolicies add up: what one allows, the
    deny-all does not take back."""
    rules = []
    for target in targets:
        rule: dict[str, Any] = {"to": [{"ipBlock": {"cidr": cidr}} for cidr in target.cidrs]}
        if target.port is not None:
            rule["ports"] = [{"protocol": "TCP", "port": target.port}]
        rules.append(rule)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": EGRESS_POLICY, "namespace": namespace},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": rules},
    }


def secret_copy_manifest(namespace: str, source: SecretSource, found: dict | None = None) -> dict:
    """The copy of a --env-from-secret Secret in the run's namespace: its data only once read
    (`found`, the Secret as the API server holds it), so a plan printed or saved never holds it."""
    where = f"{source.namespace}/{source.name}" if source.namespace else source.name
    if found is not None:
        where = f"{found['metadata'].get('namespace')}/{source.name}"
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": source.name,
            "namespace": namespace,
            "annotations": {COPIED_FROM_ANNOTATION: where},
        },
        "type": "Opaque",
    }
    if found is not None:
        manifest["data"] = dict(found.get("data") or {})
    return manifest
