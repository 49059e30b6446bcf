"""Files, and the receipt: what a run created, and the proof that it is the run's own."""

from __future__ import annotations

import itertools
import json
import os
import shlex
import sys
import threading
from typing import Any, Callable, Iterable, Iterator, NamedTuple, cast

from .constants import JOB_NAME, NAMESPACE_PREFIX, RECEIPT_FILE, RUN_LABEL
from .model import DemoError


def write_text(path: str, text: str | Iterable[str | bytes]) -> None:
    """Write a file whole or not at all (a crash never leaves half a receipt); the text may
    come in pieces, so a large file is never held whole in memory, and a piece may be bytes
    (UTF-8), written as they are."""
    # One temporary name per writer: two threads saving the same file (a log read late while
    # it is read again) must not rename each other's half-written text into place.
    temporary = f"{path}.{threading.get_ident()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            if isinstance(text, str):
                handle.write(text)
            else:
                for piece in text:
                    if isinstance(piece, str):
                        handle.write(piece)
                    elif os.linesep == "\n":  # no line ends to translate: the bytes go as they are
                        handle.flush()
                        handle.buffer.write(piece)
                    else:
                        handle.write(piece.decode("utf-8"))
        os.replace(temporary, path)
    except OSError as error:
        try:
            os.unlink(temporary)
        except OSError:
            pass  # never created, or the disk is beyond help: the error below says what failed
        raise DemoError(f"cannot write {path}: {error.strerror or error}") from None


# A list (or an object) longer than this is written one compact item per line: indenting
# makes json use its pure-Python encoder, ten times slower, which costs seconds for thousands of pods.
ONE_LINE_ITEMS_FROM = 100


class EncodedItems(NamedTuple):
    """The items of a JSON list already encoded one per text: as json.dumps writes them, or
    (`indented`) as json_pieces does at their place in the file; str, or bytes (UTF-8) that
    are written as they are."""

    texts: Callable[[], Iterator[str] | Iterator[bytes]]
    count: int  # type: ignore[assignment]  # the items', not tuple.count()
    indented: bool = False


# Where pods.json holds each pod: {"items": [pod, ...]} puts them two levels down.
POD_LIST_LEVEL = 2


def pod_json(pod: dict, indented: bool) -> str:
    """One pod's text in pods.json: compact (a long list's item), or indented at its place."""
    if not indented:
        return json.dumps(pod)
    # A pod holds no EncodedItems, so its pieces are all str.
    return "".join(cast(Iterator[str], json_pieces(pod, POD_LIST_LEVEL)))


# Items of a long list (or object) are written this many at a time: 500,000 events, each a piece
# of its own, took a second more to write.
ENCODED_ITEMS_A_PIECE = 1000


def json_pieces(value: Any, level: int = 0) -> Iterator[str | bytes]:
    """JSON indented by two spaces, as json.dumps(indent=2), but long lists and objects hold one
    item per line; in pieces, so a file of thousands of pods is written without one string of it
    all. Pieces of EncodedItems given as bytes are bytes."""
    pad = "  " * (level + 1)
    if (
        isinstance(value, EncodedItems)
        and value.count
        and (value.indented or value.count >= ONE_LINE_ITEMS_FROM)
    ):
        # Each text is json_pieces(item, level + 1) (indented) or json.dumps(item), as the list
        # branch below would make it; joined a thousand at a time, not piece by piece.
        yield "[\n"
        yield from joined_items(value.texts(), pad)
        yield "\n" + "  " * level + "]"
        return
    if isinstance(value, EncodedItems):  # a short list: written as the lists below are
        value = [json.loads(text) for text in value.texts()]
    if isinstance(value, dict) and len(value) >= ONE_LINE_ITEMS_FROM:
        # One line an item (observed.json's 100,000 pods), a thousand lines to a piece.
        yield "{\n"
        lines = (f"{json.dumps(str(key))}: {json.dumps(item)}" for key, item in value.items())
        yield from joined_items(lines, pad)
        yield "\n" + "  " * level + "}"
    elif isinstance(value, dict) and value:
        yield "{\n"
        for position, (key, item) in enumerate(value.items()):
            yield (",\n" if position else "") + f"{pad}{json.dumps(str(key))}: "
            yield from json_pieces(item, level + 1)
        yield "\n" + "  " * level + "}"
    elif isinstance(value, (list, tuple)) and len(value) >= ONE_LINE_ITEMS_FROM:
        # One line an item (results.json's rows), a thousand lines to a piece.
        yield "[\n"
        yield from joined_items((json.dumps(item) for item in value), pad)
        yield "\n" + "  " * level + "]"
    elif isinstance(value, (list, tuple)) and value:
        yield "[\n"
        for position, item in enumerate(value):
            yield ",\n" + pad if position else pad
            yield from json_pieces(item, level + 1)
        yield "\n" + "  " * level + "]"
    else:
        yield json.dumps(value)


def joined_items(texts: Iterable[str] | Iterable[bytes], pad: str) -> Iterator[str | bytes]:
    """Texts each after `pad`, joined by ",\n", ENCODED_ITEMS_A_PIECE to a piece; bytes stay
    bytes (hundreds of megabytes of spooled pods and events are not decoded to be written)."""
    remaining: Iterator[Any] = iter(texts)
    lead = pad
    while True:
        some: list = list(itertools.islice(remaining, ENCODED_ITEMS_A_PIECE))
        if not some:
            return
        if isinstance(some[0], bytes):
            yield lead.encode("utf-8") + (",\n" + pad).encode("utf-8").join(some)
        else:
            yield lead + (",\n" + pad).join(some)
        lead = ",\n" + pad


def write_json(path: str, data: Any) -> None:
    def pieces() -> Iterator[str | bytes]:
        yield from json_pieces(data)
        yield "\n"

    write_text(path, pieces())


def read_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise DemoError(f"{what} not found: {path}") from None
    except (OSError, ValueError) as error:
        raise DemoError(f"{what} unreadable: {path}: {error}") from None


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def program_name() -> str:
    name = os.path.basename(sys.argv[0] or "")
    return name if name and not name.endswith(".py") else "python3 rl_batch_demo.py"


def kubeconfig_path() -> str:
    """The kubeconfig kubectl reads here: $KUBECONFIG (maybe a list), else ~/.kube/config."""
    return os.environ.get("KUBECONFIG") or os.path.join(os.path.expanduser("~"), ".kube", "config")


def cleanup_command(output: str, kubectl_binary: str = "kubectl") -> str:
    extra = "" if kubectl_binary == "kubectl" else f" --kubectl {shlex.quote(kubectl_binary)}"
    return f"{program_name()} cleanup --output {shlex.quote(output)}{extra}"


def attach_command(output: str, kubectl_binary: str = "kubectl") -> str:
    """The command that picks a run up again, once its client is gone."""
    extra = "" if kubectl_binary == "kubectl" else f" --kubectl {shlex.quote(kubectl_binary)}"
    return f"{program_name()} attach --output {shlex.quote(output)}{extra}"


class Receipt:
    """receipt.json: the namespace and Jobs of one run and their UIDs, saved whole at every change.

    A run writes it before it changes anything in the cluster and adds each UID the
    moment the object exists, so an interruption at any point leaves a receipt that
    names everything created so far; cleanup deletes only what it proves.
    """

    def __init__(self, path: str, fields: dict[str, Any]) -> None:
        self.path = path
        self.fields = fields

    @classmethod
    def start(
        cls,
        output: str,
        context: str,
        namespace: str,
        run_id: str,
        kubeconfig: str | None = None,
        shared: bool = False,
    ) -> Receipt:
        """A new run's receipt, with the kubeconfig its context came from; written by its first
        `save()`. `shared`: the run's namespace is not its own (`--namespace`); cleanup deletes only
        the objects the receipt names, never the namespace."""
        fields: dict[str, Any] = {"context": context, "namespace": namespace, "run_id": run_id}
        if shared:
            fields.update(shared_namespace=True, objects=[])
        return cls(
            os.path.join(output, RECEIPT_FILE),
            dict(fields, kubeconfig=kubeconfig) if kubeconfig else fields,
        )

    @classmethod
    def read(cls, output: str) -> Receipt:
        """The receipt in a run's directory, written by this tool or by the guide's script."""
        path = os.path.join(output, RECEIPT_FILE)
        fields = read_json(path, "receipt")
        if not isinstance(fields, dict) or not all(
            isinstance(fields.get(k), str) and fields.get(k)
            for k in ("context", "namespace", "run_id")
        ):
            raise DemoError(
                f"receipt {path} lacks context, namespace or run_id; nothing was deleted"
            )
        if not fields["namespace"].startswith(NAMESPACE_PREFIX) and not fields.get(
            "shared_namespace"
        ):
            raise DemoError(
                f"receipt names namespace {fields['namespace']!r}, which this tool never "
                f"creates; nothing was deleted"
            )
        return cls(path, fields)

    @property
    def context(self) -> str:
        return self.fields["context"]

    @property
    def namespace(self) -> str:
        return self.fields["namespace"]

    @property
    def run_id(self) -> str:
        return self.fields["run_id"]

    @property
    def namespace_uid(self) -> str | None:
        """Ours under `namespace_uid`, the guide's under `uid`."""
        return self.fields.get("namespace_uid") or self.fields.get("uid")

    @property
    def shared(self) -> bool:
        """The run shares a namespace it did not create: only its named objects are its own."""
        return bool(self.fields.get("shared_namespace"))

    def save(self) -> None:
        write_json(self.path, self.fields)

    def record_object(self, kind: str, name: str, uid: str) -> None:
        """An object other than a Job made in a shared namespace (a ConfigMap, a Secret, a
        NetworkPolicy), its UID saved before the next object is made."""
        self.fields.setdefault("objects", []).append({"kind": kind, "name": name, "uid": uid})
        self.save()

    def objects(self) -> list[dict[str, str]]:
        """Every object of a shared-namespace run, Jobs last: {kind, name, uid}."""
        jobs = [
            {"kind": "Job", "name": name, "uid": uid or ""}
            for name, uid in (self.fields.get("jobs") or {}).items()
        ]
        return [dict(item) for item in self.fields.get("objects") or []] + jobs

    def record_namespace(self, uid: str) -> None:
        """The namespace's UID under the guide's key `uid`, and under our clearer name beside it."""
        self.fields["uid"] = self.fields["namespace_uid"] = uid
        self.save()

    def record_job(self, job_name: str, uid: str) -> None:
        """Every Job of the run under `jobs`; the guide's `job_uid` is only ever Job `rollout`'s,
        since the guide's cleanup deletes the Job of that name when its UID matches."""
        self.fields.setdefault("jobs", {})[job_name] = uid
        if job_name == JOB_NAME and not self.shared:
            self.fields["job_uid"] = uid
        self.save()

    def has_job(self, job_name: str) -> bool:
        return job_name in (self.fields.get("jobs") or {})

    def job_uids(self) -> dict[str, str | None]:
        """The UID of every Job the receipt names; an old receipt's Job `rollout` by its saved job.json."""
        expected = dict(self.fields.get("jobs") or {})
        if self.fields.get("job_uid"):
            expected.setdefault(JOB_NAME, self.fields["job_uid"])
        if JOB_NAME not in expected:
            saved = os.path.join(os.path.dirname(self.path), "job.json")
            if os.path.exists(saved):
                expected[JOB_NAME] = (read_json(saved, "job.json").get("metadata") or {}).get("uid")
        return expected

    def owns_namespace(self, live: dict | None) -> bool:
        """Whether a live namespace is this run's: it carries the run's label and, once the
        receipt holds a UID, that UID (a namespace deleted and made again under the name is not)."""
        metadata = (live or {}).get("metadata") or {}
        if (metadata.get("labels") or {}).get(RUN_LABEL) != self.run_id:
            return False
        return not self.namespace_uid or metadata.get("uid") == self.namespace_uid
