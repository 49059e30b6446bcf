"""--env-from-secret at run time: each Secret found before anything is created, and copied into the
run's namespace once it exists (a pod's envFrom reads a Secret of its own namespace only). Its values
are held in memory alone, from the one read to the one create: never printed, logged or saved."""

from __future__ import annotations

import time

from .constants import FIRST_CONTACT_RETRY_SECONDS
from .model import DemoError, SecretSource
from .kube import KubectlError
from .follow import RunContext
from .podspec import COPIED_FROM_ANNOTATION

# The Secrets read for a run, by name: what their copies are made from.
ReadSecrets = dict[str, dict]


def read_secrets(run: RunContext) -> ReadSecrets:
    """Each --env-from-secret Secret, read before anything is created; DemoError names one that is
    missing or may not be read, and says that nothing was created."""
    found: ReadSecrets = {}
    for source in run.settings.pod.secrets:
        found[source.name] = read_secret(run, source)
    return found


def read_secret(run: RunContext, source: SecretSource) -> dict:
    given = run.spelling.setting(
        "env_from_secret",
        f"{source.namespace}/{source.name}" if source.namespace else source.name,
    )
    where = f"namespace {source.namespace}" if source.namespace else "the context's namespace"
    try:
        # Without -n, kubectl looks in the context's namespace, as the user's own kubectl would.
        secret = run.kubectl.get(
            "secret",
            source.name,
            source.namespace,
            missing_ok=True,
            retry_until=time.monotonic() + FIRST_CONTACT_RETRY_SECONDS,
        )
    except KubectlError as error:
        if "forbidden" in error.stderr.lower():
            raise DemoError(
                f"{given}: may not get Secret {source.name} in {where} (the copy into the run's "
                f"namespace needs get on it, and create secrets); nothing was created"
            ) from None
        raise DemoError(
            f"{given}: cannot read Secret {source.name}: {error}; nothing was created"
        ) from None
    if secret is None:
        raise DemoError(
            f"{given}: no Secret {source.name} in {where}; nothing was created (make it with "
            f"kubectl create secret generic {source.name} --from-literal=KEY=VALUE)"
        )
    return secret


def filled(manifest: dict, secrets: ReadSecrets) -> dict:
    """A planned object as it is created: a Secret's copy (planned without its data) with the data
    of the Secret read; any other object as planned."""
    metadata = manifest.get("metadata") or {}
    if manifest.get("kind") != "Secret" or COPIED_FROM_ANNOTATION not in (
        metadata.get("annotations") or {}
    ):
        return manifest
    original = metadata["annotations"][COPIED_FROM_ANNOTATION].rpartition("/")[2]
    found = secrets[original]
    where = f"{found['metadata'].get('namespace')}/{original}"
    # As planned (its name after the run's in a namespace it shares, its labels), with the data.
    return {
        **manifest,
        "metadata": {
            **metadata,
            "annotations": {**metadata["annotations"], COPIED_FROM_ANNOTATION: where},
        },
        "data": dict(found.get("data") or {}),
    }
