"""Manifests: plain dicts built from their arguments alone; and capacity: can the batch's pods all
run at once on the nodes there are?
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from .constants import (
    APP_LABEL,
    BATCH_LABEL,
    IDLE_EXIT_CODE,
    SANDBOX_CONTAINER,
    SANDBOX_OUTPUT_CAP_BYTES,
    SANDBOX_PORT,
    SERVER_KEY,
    TOKEN_KEY,
    TOKEN_MOUNT,
    TOKEN_SECRET,
    COMPLETION_INDEX_ANNOTATION,
    DEADLINE_ANNOTATION,
    CONFIGMAP_NAME,
    CONTAINER_NAME,
    DEFAULT_JOB_DEADLINE_SECONDS,
    EPISODES_PLANNED_ANNOTATION,
    EPISODE_INDEXES_ANNOTATION,
    EPISODE_LAUNCHER,
    EXPIRES_ANNOTATION,
    HOST_ANNOTATION,
    INFRASTRUCTURE_EXIT_CODES,
    JOBS_PLANNED_ANNOTATION,
    JOB_NAME,
    OUTPUT_ANNOTATION,
    PREPULL_LABEL,
    RUN_ID_ANNOTATION,
    RUN_LABEL,
    TASKS_CONFIGMAP_BYTES,
    TASKS_CONFIGMAP_PREFIX,
    TASKS_MAX_CONFIGMAPS,
    TASKS_MOUNT,
    TASKS_VOLUME,
    TASK_FILE_ENV,
    USER_ANNOTATION,
    VERSION_ANNOTATION,
    WORKER_KEY,
    LAUNCHER_KEY,
    EPISODE_EXIT_ANNOTATION,
    EPISODE_EXIT_RECORDED,
    EPISODE_TIMEOUT_ENV,
)
from .model import (
    GUIDE_POD,
    DemoError,
    EgressTarget,
    EpisodePod,
    ImageGroup,
    PoolShape,
    RolloutPolicy,
    Task,
)
from .stats import rounded
from .parse import (
    EventRecord,
    condition_true,
    container_image,
    index_ranges,
    pod_name,
    pod_warnings,
    rfc3339,
)


class RunOrigin(NamedTuple):
    """Who starts a run, from where, and until when it may live: its namespace's annotations."""

    run_id: str
    version: str
    host: str
    output: str  # absolute
    user: str
    expires_at: float | None  # epoch seconds, from `run --ttl`


def origin_annotations(origin: RunOrigin) -> dict[str, str]:
    """The annotations that let `list` and `cleanup --stale` know a run without its receipt."""
    annotations = {
        RUN_ID_ANNOTATION: origin.run_id,
        VERSION_ANNOTATION: origin.version,
        HOST_ANNOTATION: origin.host,
        OUTPUT_ANNOTATION: origin.output,
        USER_ANNOTATION: origin.user,
    }
    if origin.expires_at is not None:
        annotations[EXPIRES_ANNOTATION] = rfc3339(origin.expires_at)
    return annotations


class PlannedWork(NamedTuple):
    """What a run plans, every batch told: its Jobs and their episodes (completions)."""

    jobs: int
    episodes: int


def planned_work(jobs: Mapping[str, Sequence[dict]]) -> PlannedWork:
    """The Jobs and episodes of every batch of a plan (RunPlan.jobs)."""
    manifests = [manifest for batch in jobs.values() for manifest in batch]
    return PlannedWork(
        len(manifests),
        sum(int(manifest["spec"].get("completions") or 1) for manifest in manifests),
    )


def planned_annotations(planned: PlannedWork) -> dict[str, str]:
    return {
        JOBS_PLANNED_ANNOTATION: str(planned.jobs),
        EPISODES_PLANNED_ANNOTATION: str(planned.episodes),
    }


def namespace_manifest(
    namespace: str,
    run_id: str,
    harden: bool = False,
    origin: RunOrigin | None = None,
    planned: PlannedWork | None = None,
) -> dict:
    """The run's own Namespace, labelled with the run id; annotated with its origin and with what
    it plans, when given (in the manifest itself, so the namespace never exists without them)."""
    labels = {RUN_LABEL: run_id}
    if harden:
        labels.update(
            {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
                "pod-security.kubernetes.io/warn": "restricted",
                "pod-security.kubernetes.io/audit": "restricted",
            }
        )
    metadata: dict[str, Any] = {"name": namespace, "labels": labels}
    annotations = {
        **(origin_annotations(origin) if origin is not None else {}),
        **(planned_annotations(planned) if planned is not None else {}),
    }
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def configmap_manifest(namespace: str, worker_source: str, launcher: bool = False) -> dict:
    """The ConfigMap that ships the episode program to every pod; a rollout's, the launcher too."""
    data = {WORKER_KEY: worker_source}
    if launcher:
        data[LAUNCHER_KEY] = EPISODE_LAUNCHER
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP_NAME, "namespace": namespace},
        "data": data,
    }


def network_policy_manifest(namespace: str) -> dict:
    """Deny all ingress and egress for every pod of the namespace."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "deny-all", "namespace": namespace},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    }


def pool_network_policy_manifest(namespace: str) -> dict:
    """--harden for a pool: no egress at all, and no ingress but to the sandbox server's port.
    The API server's pod proxy reaches that port from a node's address, which no selector of pods
    or namespaces names (and a deny-all policy, enforced, would refuse it): the port is open to
    any source, the run's token keeping out every request but the pool's."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "deny-all-but-sandbox-port", "namespace": namespace},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": SANDBOX_PORT}]}],
        },
    }


def file_line(number: int) -> str:
    return f"line {number}"


def parse_tasks(lines: Iterable[str], place: Callable[[int], str] = file_line) -> list[Task]:
    """The tasks of a JSONL file: one JSON object per non-blank line; ValueError names a bad
    line as `place` says it (a file's line number, or a Python list's index)."""
    tasks = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        try:
            value = json.loads(text)
        except ValueError as error:
            raise ValueError(f"{place(number)} is not JSON ({error})") from None
        if not isinstance(value, dict):
            raise ValueError(f"{place(number)} is not a JSON object")
        task_id = value.get("id", number)
        if isinstance(task_id, (dict, list)) or task_id is None:
            raise ValueError(f"{place(number)}: the task id must be a string or a number")
        image = value.get("image")
        if "image" in value and (
            not isinstance(image, str) or not image.strip() or image != image.strip()
        ):
            raise ValueError(
                f"{place(number)}: the task image must be a non-empty string without spaces "
                f"around it, got {image!r}"
            )
        # Always a string: a trainer joining rewards to tasks by id meets one type, not "a" and 3.
        tasks.append(
            Task(task_id if isinstance(task_id, str) else json.dumps(task_id), number, text, image)
        )
    if not tasks:
        raise ValueError("no tasks in it")
    ids = [task.task_id for task in tasks]
    if len(set(map(json.dumps, ids))) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"task id {duplicate!r} appears more than once")
    return tasks


def parse_image_map(texts: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """--image-map FROM=TO, each given: (FROM, TO) pairs; ValueError names a malformed one."""
    pairs: list[tuple[str, str]] = []
    for text in texts:
        source, equals, target = text.partition("=")
        if (
            not equals
            or not source
            or not target
            or source != source.strip()
            or target != target.strip()
        ):
            raise ValueError(
                f"{text!r} is not FROM=TO (two image reference prefixes, e.g. "
                f"docker.io/swebench=registry.internal/swebench)"
            )
        if any(source == earlier for earlier, _ in pairs):
            raise ValueError(f"{source!r} is mapped twice")
        pairs.append((source, target))
    return tuple(pairs)


def names_registry(part: str) -> bool:
    """Whether a reference's first part is a registry host (a `.` or `:` in it, or `localhost`)."""
    return "." in part or ":" in part or part == "localhost"


def docker_hub_reference(image: str) -> str:
    """A reference in full, as containerd resolves it: a name whose first part names no registry
    host is Docker Hub's, `library/` for a bare one."""
    first, slash, _ = image.partition("/")
    if slash and names_registry(first):
        return image
    return f"docker.io/{image}" if slash else f"docker.io/library/{image}"


def prefix_matches(image: str, source: str) -> bool:
    """`source` begins `image` at a boundary of its parts: `docker.io/swebench` is a prefix of
    `docker.io/swebench/a:1` but not of `docker.io/swebench-extra/a:1`."""
    if not image.startswith(source):
        return False
    return source.endswith(("/", ":")) or image[len(source) : len(source) + 1] in (
        "",
        "/",
        ":",
        "@",
    )


def source_references(source: str) -> list[str]:
    """The full references a FROM of --image-map may stand for: itself when it starts with a
    registry host, else Docker Hub's (`swebench` is `docker.io/swebench`, `python` also
    `docker.io/library/python`)."""
    first, slash, _ = source.partition("/")
    if names_registry(first):
        return [source]
    return [f"docker.io/{source}"] + ([] if slash else [f"docker.io/library/{source}"])


def rewrite_image(image: str, image_map: Sequence[tuple[str, str]]) -> str:
    """An image reference with its prefix rewritten by the longest FROM it starts with (at most
    once), both read in full as containerd resolves them (Docker Hub's short forms `python:3` and
    `swebench/a:1` are `docker.io/library/python:3` and `docker.io/swebench/a:1`), and matched
    at a boundary of the reference's parts."""
    full = docker_hub_reference(image)
    matches = [
        (len(prefix), prefix, target)
        for source, target in image_map
        for prefix in source_references(source)
        if prefix_matches(full, prefix)
    ]
    if not matches:
        return image
    _, prefix, target = max(matches, key=lambda match: match[0])
    return target + full[len(prefix) :]


def task_images(
    tasks: Sequence[Task], default_image: str, image_map: Sequence[tuple[str, str]] = ()
) -> list[str]:
    """Each task's image: its own rewritten by the map, else `default_image` (--image, rewritten already)."""
    return [rewrite_image(task.image, image_map) if task.image else default_image for task in tasks]


def image_groups(
    tasks: Sequence[Task],
    count: int,
    group_size: int,
    default_image: str,
    image_map: Sequence[tuple[str, str]] = (),
) -> list[ImageGroup]:
    """The run's episodes by image, in order of the image's first appearance (see task_images);
    without tasks, every episode runs the default image."""
    if not tasks:
        return [ImageGroup(default_image, tuple(range(count)))]
    by_image: dict[str, list[int]] = {}
    for position, image in enumerate(task_images(tasks, default_image, image_map)):
        by_image.setdefault(image, []).extend(
            range(position * group_size, (position + 1) * group_size)
        )
    return [ImageGroup(image, tuple(indexes)) for image, indexes in by_image.items()]


def parallelism_shares(parallelism: int, sizes: Sequence[int]) -> list[int]:
    """--parallelism shared between the Jobs of one batch: each Job's share in proportion to its
    episodes, at least 1 and at most its episodes, the shares adding up to at most `parallelism`
    (largest remainders first); ValueError when there are more Jobs than pods at once."""
    if len(sizes) > parallelism:
        raise ValueError(f"{len(sizes)} images need at least one pod each at once")
    total = sum(sizes)
    exact = [parallelism * size / total for size in sizes]
    shares = [min(size, max(1, math.floor(share))) for size, share in zip(sizes, exact)]
    by_remainder = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - math.floor(exact[i])), i))
    while sum(shares) < parallelism and any(shares[i] < sizes[i] for i in by_remainder):
        for i in by_remainder:
            if sum(shares) < parallelism and shares[i] < sizes[i]:
                shares[i] += 1
    while sum(shares) > parallelism:  # the minimum of 1 each took more than its share
        widest = max(range(len(sizes)), key=lambda i: (shares[i], -i))
        shares[widest] -= 1
    return shares


def task_key(position: int) -> str:
    return f"task-{position}.json"


def task_configmaps(namespace: str, tasks: Sequence[Task]) -> list[dict]:
    """The ConfigMaps that carry the tasks, one key per task, split to stay under a ConfigMap's size."""
    chunks: list[dict[str, str]] = [{}]
    size = 0
    for position, task in enumerate(tasks):
        key = task_key(position)
        entry = len(key.encode("utf-8")) + len(task.text.encode("utf-8"))
        if entry > TASKS_CONFIGMAP_BYTES:
            raise DemoError(
                f"task on line {task.line} takes {entry} bytes; one task may take at most "
                f"{TASKS_CONFIGMAP_BYTES} bytes (a ConfigMap holds 1 MiB); nothing was created"
            )
        if size + entry > TASKS_CONFIGMAP_BYTES:
            chunks.append({})
            size = 0
        chunks[-1][key] = task.text
        size += entry
    if len(chunks) > TASKS_MAX_CONFIGMAPS:
        total = sum(len(t.text.encode("utf-8")) for t in tasks)
        raise DemoError(
            f"the tasks take {total} bytes, more than {TASKS_MAX_CONFIGMAPS} ConfigMaps of "
            f"{TASKS_CONFIGMAP_BYTES} bytes can carry; split them into several batches; "
            f"nothing was created"
        )
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{TASKS_CONFIGMAP_PREFIX}{number}", "namespace": namespace},
            "data": data,
        }
        for number, data in enumerate(chunks)
    ]


def tasks_volume(
    configmaps: Sequence[dict], group_size: int, indexes: Iterable[int] | None = None
) -> dict:
    """One volume with a file per episode, `<episode index>.json`, holding that episode's task:
    episodes g*G .. g*G+G-1 share task g, projected from its one ConfigMap key. With `indexes`
    (the episodes of one image's Job), only theirs."""
    wanted = None if indexes is None else set(indexes)
    sources = []
    for configmap in configmaps:
        items = []
        for key in configmap["data"]:
            position = int(key[len("task-") : -len(".json")])
            items += [
                {"key": key, "path": f"{index}.json"}
                for index in range(position * group_size, (position + 1) * group_size)
                if wanted is None or index in wanted
            ]
        if items:
            sources.append({"configMap": {"name": configmap["metadata"]["name"], "items": items}})
    return {"name": TASKS_VOLUME, "projected": {"sources": sources}}


def pod_failure_policy() -> dict:
    """Retry what is not the episode's doing; fail an episode at once on its own failure.

    A disruption (eviction, preemption, node loss) is counted against the episode's
    retries even when its container then exits with a code of its own; any other
    exit code of the episode container, save those of INFRASTRUCTURE_EXIT_CODES,
    is the episode's verdict and is never retried.
    """
    return {
        "rules": [
            {
                "action": "Count",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
            {
                "action": "FailIndex",
                "onExitCodes": {
                    "containerName": CONTAINER_NAME,
                    "operator": "NotIn",
                    "values": list(INFRASTRUCTURE_EXIT_CODES),
                },
            },
        ]
    }


class Launch(NamedTuple):
    """How a rollout's pod runs its episode: through EPISODE_LAUNCHER, which records the program's
    own end; in a Job of several (`several`: its run-wide indexes set from EPISODE_INDEXES), and
    with the episode's own time (`timeout`, seconds from the launcher's start) if it has one."""

    several: bool = False
    timeout: int | None = None


def episode_env(indexed: bool, tasks: dict | None, launch: Launch | None = None) -> list[dict]:
    """The episode's environment: its pod's name, and in an Indexed Job its index and its task file
    (in a Job of several, the run-wide indexes of its Job's completion indexes, which
    EPISODE_LAUNCHER reads); under the launcher, the episode's own time."""
    env: list[dict[str, Any]] = [
        {"name": "EPISODE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    if launch is not None and launch.several:
        env.append(
            {
                "name": "EPISODE_INDEXES",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": f"metadata.annotations['{EPISODE_INDEXES_ANNOTATION}']"
                    }
                },
            }
        )
    else:
        env += indexed_env(indexed, tasks)
    if launch is not None and launch.timeout is not None:
        env.append({"name": EPISODE_TIMEOUT_ENV, "value": str(launch.timeout)})
    return env


def indexed_env(indexed: bool, tasks: dict | None) -> list[dict]:
    """In an Indexed Job of its own: the episode's index, and the task file it names."""
    env: list[dict[str, Any]] = []
    if indexed:
        env.append(
            {
                "name": "EPISODE_INDEX",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
                    }
                },
            }
        )
    if tasks:
        # $(EPISODE_INDEX) expands because it is defined earlier in the list.
        env.append({"name": TASK_FILE_ENV, "value": f"{TASKS_MOUNT}/$(EPISODE_INDEX).json"})
    return env


def episode_container(
    image: str,
    harden: bool,
    indexed: bool,
    tasks: dict | None,
    launch: Launch | None = None,
    pod: EpisodePod = GUIDE_POD,
) -> dict:
    """The container that runs the episode program: unprivileged, the requests and limits of `pod`
    (small by default), its --env after the tool's own and its Secrets' keys (envFrom: the kubelet
    lets `env` win); a rollout's, through EPISODE_LAUNCHER (`launch`)."""
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if harden:
        security["readOnlyRootFilesystem"] = True
    mounts = [
        {"name": "demo", "mountPath": "/demo", "readOnly": True},
        {"name": "workspace", "mountPath": "/workspace"},
    ]
    if tasks:
        mounts.append({"name": TASKS_VOLUME, "mountPath": TASKS_MOUNT, "readOnly": True})
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-B", f"/demo/{LAUNCHER_KEY if launch else WORKER_KEY}"],
        "env": episode_env(indexed, tasks, launch)
        + [{"name": key, "value": value} for key, value in pod.env],
        "securityContext": security,
        "resources": pod_resources(pod),
        "volumeMounts": mounts,
    }
    if pod.secrets:
        container["envFrom"] = [{"secretRef": {"name": secret.name}} for secret in pod.secrets]
    return container


def pod_resources(pod: EpisodePod) -> dict:
    """A container's requests and limits from --cpu and --memory (the guide's by default)."""
    return {
        "requests": {"cpu": pod.cpu[0], "memory": pod.memory[0]},
        "limits": {"cpu": pod.cpu[1], "memory": pod.memory[1]},
    }


def host_aliases(targets: Sequence[EgressTarget]) -> list[dict]:
    """Each HOST of --allow-egress pinned to its resolved addresses in the pods' /etc/hosts: the
    deny-all leaves them no DNS, and the NetworkPolicy lets them reach those addresses alone."""
    names: dict[str, list[str]] = {}
    for target in targets:
        host = target.host
        if host is None:
            continue
        for cidr in target.cidrs:
            address = str(ipaddress.ip_network(cidr).network_address)
            if host not in names.setdefault(address, []):
                names[address].append(host)
    return [{"ip": address, "hostnames": hostnames} for address, hostnames in names.items()]


def episode_pod_spec(
    image: str,
    runtime: str,
    harden: bool,
    indexed: bool,
    tasks: dict | None,
    episode_timeout: int | None = None,
    launch: Launch | None = None,
    pod: EpisodePod = GUIDE_POD,
) -> dict:
    """An episode's pod: in the sandbox runtime, never restarted, non-root, without a service account token;
    with `episode_timeout`, stopped by its kubelet that many seconds after the pod started; each
    host --allow-egress names pinned to its addresses."""
    volumes = [
        {"name": "demo", "configMap": {"name": CONFIGMAP_NAME}},
        {"name": "workspace", "emptyDir": {"sizeLimit": "64Mi"} if harden else {}},
    ]
    if tasks:
        volumes.append(tasks)
    deadline = {} if episode_timeout is None else {"activeDeadlineSeconds": episode_timeout}
    aliases = host_aliases(pod.egress)
    return {
        **deadline,
        **({"hostAliases": aliases} if aliases else {}),
        "runtimeClassName": runtime,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "runAsNonRoot": True,
        },
        "containers": [episode_container(image, harden, indexed, tasks, launch, pod)],
        "volumes": volumes,
    }


def job_manifest(
    namespace: str,
    count: int,
    parallelism: int,
    image: str,
    runtime: str,
    deadline_seconds: int = DEFAULT_JOB_DEADLINE_SECONDS,
    name: str = JOB_NAME,
    harden: bool = False,
    indexed: bool = False,
    tasks: dict | None = None,
    policy: RolloutPolicy | None = None,
    episode_timeout: int | None = None,
    batch: str | None = None,
    episode_indexes: Sequence[int] | None = None,
    launch: Launch | None = None,
    deadline_parts: str | None = None,
    pod: EpisodePod = GUIDE_POD,
) -> dict:
    """The Job whose pods are the episodes: backoffLimit 0, so one failed episode fails the batch.

    `tasks` (a volume from tasks_volume) gives each episode its task file, named by
    TASK_FILE; `policy` replaces backoffLimit 0 with retries per episode
    (backoffLimitPerIndex), a number of failed episodes the Job tolerates
    (maxFailedIndexes) and the podFailurePolicy that tells whose failure it was; its
    `need` ends the Job once that many episodes succeeded (successPolicy), the rest
    stopped. `episode_timeout` is each pod's activeDeadlineSeconds, `deadline_parts` what it is
    made of (DEADLINE_ANNOTATION). `pod`: each pod's resources, environment and pinned hosts.

    `launch`: a rollout's pods run their episode through EPISODE_LAUNCHER, which records the
    episode's own failure and ends the pod 0, so that only a failure of the infrastructure fails a
    pod (and counts against the Job's limits). `batch` and `episode_indexes`: this Job is one of
    several in batch `batch` (one per image), its completion index i the run's episode
    episode_indexes[i] (always launched).
    """
    indexed_mode = bool(indexed or tasks or policy or episode_indexes is not None)
    if episode_indexes is not None:
        launch = (launch or Launch())._replace(several=True)
    spec: dict[str, Any] = {
        "completions": count,
        "parallelism": parallelism,
        "backoffLimit": 0,
        "activeDeadlineSeconds": deadline_seconds,
        "template": {
            "metadata": episode_pod_metadata(
                batch, episode_indexes, launch is not None, deadline_parts
            ),
            "spec": episode_pod_spec(
                image, runtime, harden, indexed_mode, tasks, episode_timeout, launch, pod
            ),
        },
    }
    if indexed_mode:
        spec["completionMode"] = "Indexed"
    if policy:
        # The Job-wide limit would end the batch at its first failure; each episode has its own.
        del spec["backoffLimit"]
        spec.update(rollout_policy_spec(policy))
    metadata = job_metadata(namespace, name, batch if episode_indexes is not None else None)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def job_metadata(namespace: str, name: str, batch: str | None) -> dict[str, Any]:
    """A Job's name and namespace; one of batch `batch`'s several Jobs, labelled with it."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if batch is not None:
        # The API server copies the template's labels onto a Job only when the Job has none: one
        # with labels of its own carries the tool's too, or list and cleanup --stale miss it.
        metadata["labels"] = {"app": APP_LABEL, BATCH_LABEL: batch}
    return metadata


def episode_pod_metadata(
    batch: str | None,
    episode_indexes: Sequence[int] | None,
    launched: bool = False,
    deadline_parts: str | None = None,
) -> dict:
    """The labels of every episode's pod; in one of a batch's several Jobs, its batch and the run's
    episode indexes too; under the launcher, that its episode's own end is recorded in its log;
    with a deadline, what it is made of."""
    metadata: dict[str, Any] = {"labels": {"app": APP_LABEL}}
    annotations = {}
    if episode_indexes is not None:
        metadata["labels"][BATCH_LABEL] = batch
        annotations[EPISODE_INDEXES_ANNOTATION] = index_ranges(episode_indexes)
    if launched:
        annotations[EPISODE_EXIT_ANNOTATION] = EPISODE_EXIT_RECORDED
    if deadline_parts is not None:
        annotations[DEADLINE_ANNOTATION] = deadline_parts
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def rollout_policy_spec(policy: RolloutPolicy) -> dict[str, Any]:
    """What a rollout's Job spec says of its failures: retries per episode, how many failed
    episodes it tolerates, whose failure a pod's was, and (--need) when enough have succeeded."""
    spec: dict[str, Any] = {
        "backoffLimitPerIndex": policy.retries,
        "maxFailedIndexes": policy.allow_failures,
        "podFailurePolicy": pod_failure_policy(),
    }
    if policy.need is not None:
        spec["successPolicy"] = {"rules": [{"succeededCount": policy.need}]}
    return spec


def list_manifest(items: Sequence[dict]) -> dict:
    """A `v1 List`, the shape kubectl prints for several objects."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": list(items)}


def prepull_pod_manifest(
    namespace: str,
    name: str,
    node: str,
    image: str,
    runtime: str,
    harden: bool,
    deadline_seconds: int,
) -> dict:
    """A pod that makes `image` present on `node` (--prepull): bound to the node, in the episodes' runtime
    and security settings, running `python -c pass` (every episode image already needs Python), stopped by
    its kubelet after `deadline_seconds`."""
    container = dict(
        episode_container(image, harden, False, None),
        name="prepull",
        command=["python", "-c", "pass"],
        env=[],
        volumeMounts=[],
    )
    spec = episode_pod_spec(image, runtime, harden, False, None, deadline_seconds)
    spec.update(nodeName=node, containers=[container], volumes=[])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": APP_LABEL, PREPULL_LABEL: "true"},
        },
        "spec": spec,
    }


def usable_nodes(nodes: Sequence[dict], runtime_class: dict | None) -> list[str]:
    """The nodes an episode's pod can run on: schedulable, with the RuntimeClass's node labels."""
    wanted = ((runtime_class or {}).get("scheduling") or {}).get("nodeSelector") or {}
    usable = []
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if schedulable(node) and all(labels.get(key) == value for key, value in wanted.items()):
            usable.append(node["metadata"]["name"])
    return sorted(usable)


def run_images(plan_jobs: dict[str, list[dict]]) -> list[str]:
    """Every image the run's Jobs name, in order of first appearance."""
    images: list[str] = []
    for jobs in plan_jobs.values():
        for job in jobs:
            image = job["spec"]["template"]["spec"]["containers"][0]["image"]
            if image not in images:
                images.append(image)
    return images


def prepull_failures(pods: Sequence[dict], events: Sequence[EventRecord] = ()) -> list[dict]:
    """Each --prepull pod that did not succeed: its node, image and why (the kubelet's words)."""
    warnings = pod_warnings(events)
    failures = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") == "Succeeded":
            continue
        state = (((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("state")) or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
        why = (
            f"{waiting.get('reason')}: {waiting.get('message', '')}"
            if waiting
            else f"{terminated.get('reason', 'ended')} with exit code {terminated.get('exitCode')}"
            if terminated
            else (pod.get("status") or {}).get("reason")
            or (pod.get("status") or {}).get("phase")
            or "not started"
        )
        warned = warnings.get(pod_name(pod))
        failures.append(
            {
                "pod": pod_name(pod),
                "node": (pod.get("spec") or {}).get("nodeName"),
                "image": container_image(pod),
                "why": f"{why}" + (f"; pod warnings: {'; '.join(warned)}" if warned else ""),
            }
        )
    return failures


QUANTITY_SUFFIXES = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "": 1.0,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
}


def parse_quantity(text: Any) -> float | None:
    """A Kubernetes quantity ("250m", "768Mi", "1e3", 2) as a number, or None if it is not one."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    match = re.fullmatch(
        r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)([a-zA-Z]{0,2})\s*", str(text or "")
    )
    if not match or match.group(2) not in QUANTITY_SUFFIXES:
        return None
    return float(match.group(1)) * QUANTITY_SUFFIXES[match.group(2)]


def schedulable(node: dict) -> bool:
    """A node that takes new pods: Ready, not cordoned, no NoSchedule/NoExecute taint."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    if any(
        taint.get("effect") in ("NoSchedule", "NoExecute") for taint in spec.get("taints") or []
    ):
        return False
    return condition_true(node, "Ready")


def capacity_plan(
    nodes: Sequence[dict], runtime_class: dict | None, requests: dict, count: int, parallelism: int
) -> dict:
    """How many episodes fit at once on the nodes' allocatable CPU, memory and pod slots; pure.

    Counts allocatable resources, not what other pods already use, so it is an upper bound.
    """
    overhead = ((runtime_class or {}).get("overhead") or {}).get("podFixed") or {}
    need = {
        resource: (parse_quantity(requests.get(resource)) or 0.0)
        + (parse_quantity(overhead.get(resource)) or 0.0)
        for resource in ("cpu", "memory")
    }
    fits: dict[str, int] = {}
    for node in nodes:
        if not schedulable(node):
            continue
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        room = [
            math.floor((parse_quantity(allocatable.get(resource)) or 0.0) / need[resource] + 1e-9)
            for resource in ("cpu", "memory")
            if need[resource] > 0
        ]
        pods = parse_quantity(allocatable.get("pods"))
        if pods is not None:
            room.append(int(pods))
        fits[node["metadata"]["name"]] = max(0, min(room))
    at_once = sum(fits.values())
    wanted = min(count, parallelism)
    return {
        "checked": True,
        "schedulable_nodes": len(fits),
        "nodes_seen": len(nodes),
        "per_episode": {
            "cpu": f"{requests.get('cpu', '0')} + overhead {overhead.get('cpu', '0')}",
            "memory": f"{requests.get('memory', '0')} + overhead {overhead.get('memory', '0')}",
            "cpu_cores": rounded(need["cpu"], 4),
            "memory_bytes": int(need["memory"]),
        },
        "episodes_fit_at_once": at_once,
        "episodes_fit_per_node": fits,
        "fits_at_once": at_once >= wanted,
        "expected_waves": math.ceil(count / max(1, min(wanted, at_once))) if at_once else None,
        "waves_at_parallelism": math.ceil(count / max(1, parallelism)),
        "note": "from the nodes' allocatable CPU, memory and pod slots and the RuntimeClass's podFixed "
        "overhead; pods other workloads already run are not subtracted",
    }


def capacity_warning(plan: dict, parallelism: int) -> str | None:
    """One warning when the batch's pods cannot all run at once, else None."""
    if not plan.get("checked"):
        return f"Warning: capacity check skipped ({plan.get('reason')})"
    if plan["fits_at_once"]:
        return None
    if not plan["episodes_fit_at_once"]:
        return (
            f"Warning: capacity: no schedulable node has room for one episode "
            f"({plan['per_episode']['cpu']} CPU, {plan['per_episode']['memory']} memory); "
            f"its pods will stay Pending"
        )
    return (
        f"Warning: capacity: the {plan['schedulable_nodes']} schedulable node(s) fit about "
        f"{plan['episodes_fit_at_once']} episodes at once ({plan['per_episode']['cpu']} CPU, "
        f"{plan['per_episode']['memory']} memory each), fewer than parallelism {parallelism}: "
        f"expect about {plan['expected_waves']} waves instead of {plan['waves_at_parallelism']}, "
        f"and pods Pending meanwhile"
    )


def token_secret_manifest(namespace: str, token: str) -> dict:
    """The run's sandbox token, which only its pods and this tool hold."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": TOKEN_SECRET, "namespace": namespace},
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }


def server_container(
    image: str, harden: bool, idle_timeout: int, pod: EpisodePod = GUIDE_POD
) -> dict:
    """The container that serves a trainer's commands: the episode container's security, the
    requests and limits of `pod` (--cpu, --memory), listening on its pod's IP, with the run's
    token; its --env after the tool's own, and its Secrets' keys (envFrom)."""
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if harden:
        security["readOnlyRootFilesystem"] = True
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "SANDBOX_PORT", "value": str(SANDBOX_PORT)},
        {"name": "SANDBOX_IDLE_SECONDS", "value": str(idle_timeout)},
        {"name": "SANDBOX_TOKEN_FILE", "value": f"{TOKEN_MOUNT}/{TOKEN_KEY}"},
        # Set here, though they are the server's defaults: `env` beats `envFrom`, so no Secret's
        # key can move the server's workspace or its output cap.
        {"name": "SANDBOX_WORKSPACE", "value": "/workspace"},
        {"name": "SANDBOX_PRISTINE", "value": "/sandbox-pristine/workspace"},
        {"name": "SANDBOX_OUTPUT_CAP_BYTES", "value": str(SANDBOX_OUTPUT_CAP_BYTES)},
    ] + [{"name": key, "value": value} for key, value in pod.env]
    container: dict[str, Any] = {
        "name": SANDBOX_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-B", f"/demo/{SERVER_KEY}"],
        "env": env,
        "ports": [{"name": "sandbox", "containerPort": SANDBOX_PORT, "protocol": "TCP"}],
        "securityContext": security,
        "resources": pod_resources(pod),
        "volumeMounts": [
            {"name": "demo", "mountPath": "/demo", "readOnly": True},
            {"name": "workspace", "mountPath": "/workspace"},
            {"name": "pristine", "mountPath": "/sandbox-pristine"},
            {"name": "token", "mountPath": TOKEN_MOUNT, "readOnly": True},
        ],
    }
    if pod.secrets:
        container["envFrom"] = [{"secretRef": {"name": secret.name}} for secret in pod.secrets]
    return container


def pool_job_manifest(
    namespace: str,
    name: str,
    size: int,
    episodes: int,
    image: str,
    settings: PoolShape,
    pod: EpisodePod = GUIDE_POD,
) -> dict:
    """One image's pool: `size` warm sandboxes at a time, `episodes` served in all (with reuse,
    each pod serves many and completes once). A sandbox left idle fails the Job, so a pool whose
    trainer went away makes no more pods; a pod lost to the cluster is replaced."""
    completions = size if settings.reuse else episodes
    spec = {
        "runtimeClassName": settings.runtime,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "runAsNonRoot": True,
        },
        "containers": [server_container(image, settings.harden, settings.idle_timeout, pod)],
        "volumes": [
            {"name": "demo", "configMap": {"name": CONFIGMAP_NAME}},
            {"name": "workspace", "emptyDir": {"sizeLimit": "64Mi"} if settings.harden else {}},
            {"name": "pristine", "emptyDir": {"sizeLimit": "64Mi"} if settings.harden else {}},
            {"name": "token", "secret": {"secretName": TOKEN_SECRET, "defaultMode": 0o440}},
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": APP_LABEL}},
        "spec": {
            "completions": completions,
            "parallelism": min(size, completions),
            "backoffLimit": completions + size,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": SANDBOX_CONTAINER,
                            "operator": "In",
                            "values": [IDLE_EXIT_CODE],
                        },
                    },
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                ]
            },
            "template": {"metadata": {"labels": {"app": APP_LABEL}}, "spec": spec},
        },
    }
