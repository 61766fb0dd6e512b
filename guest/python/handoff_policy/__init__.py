"""The handoff policy SDK for Python.

A policy project is the author's decisions module, ``policy.py``, on this package (installed by
version; it carries the contract, ``wit/policy.wit``, which its ``componentize-py.toml`` points
componentize-py at), built into a WebAssembly component with componentize-py::

    componentize-py -w effects-policy componentize handoff_policy -p . -o build/policy.wasm

The SDK owns the run loop, exactly as the default policy runs it: the stream opens where the
checkpoint says, every delivered event is committed on its own (``commit-batch`` with one
decision) with the resume token, an invalidation is skipped, saved with ``startAfter`` and ends the
run, the idle watermark never leaves an uncheckpointed gap, and the report is the baseline's. The
author writes only what is decided about each event::

    import handoff_policy as handoff

    def init(settings):                 # optional: read settings.params, raise to refuse them
        ...

    def decide(event):                  # every event but an invalidation
        if event.operation_type == "delete":
            return handoff.skip("deletes are not published")
        return handoff.hand_off(event.id)

``decide`` returns :func:`hand_off` (an outbox record under an ID; ``event.id``, the baseline's
ID, when none is given), :func:`skip`, :func:`quarantine` or :func:`record` (an outbox record
shaped by the policy). An exception in ``init`` or ``decide`` fails the run with its message;
what was committed before stays.

The same ``decide`` says what becomes of the documents operator commands read from the watched
collection (contract 1.3): ``handoff backfill`` and ``handoff reconcile --repair`` drive snapshot
runs, through the same run loop, in which each document is an event whose ``operation_type`` is
``"snapshot"``: ``event.id`` is its baseline ID, ``event.field("documentKey._id")`` its key and
``event.field("fullDocument")`` the document as read, ``null`` for a correction of a document the
source no longer holds. :func:`run_kind` tells the runs apart (``"changes"``, ``"backfill"``,
``"repair"``). The host keeps a snapshot run's commits and writes them with the command's
progress; an exception in ``init`` or ``decide`` fails the command, and nothing is written.

Everything runs natively too: :func:`run` drives a run over any object with the :class:`Host`
methods, and :class:`FakeHost` is one in memory, for unit tests with plain CPython (a snapshot
run too: ``FakeHost(kind="backfill").snapshot(token, key, document)``).
"""

import hashlib
import json

__all__ = [
    "Checkpoint",
    "DeliveryFailure",
    "DeliveryRecord",
    "Deployment",
    "Event",
    "FakeHost",
    "HandOff",
    "Host",
    "HostError",
    "Quarantine",
    "Record",
    "Refuse",
    "Report",
    "Settings",
    "SinkRequest",
    "Skip",
    "checkpoint",
    "classify_failure",
    "deployment",
    "effect_of",
    "event_id",
    "hand_off",
    "log",
    "monotonic_ms",
    "quarantine",
    "record",
    "refuse",
    "request",
    "run",
    "run_kind",
    "skip",
]

RESUME_AFTER = "resume-after"
START_AFTER = "start-after"

CHANGES = "changes"
BACKFILL = "backfill"
REPAIR = "repair"

SNAPSHOT = "snapshot"

IDLE = "idle"
HANDED_OFF = "handed-off"
INVALIDATED = "invalidated"

NO_IDLE_TOKEN = "MongoDB did not provide an idle resume token; refusing to leave an uncheckpointed gap"


def event_id(token):
    """The baseline's event ID: lowercase hex SHA-256 of the canonical token text."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


# Decisions ------------------------------------------------------------------------------------


class _Value:
    """Equality, hashing and a readable repr over the slots; built from every slot, in order or
    by name (a class with defaults or derived fields has its own ``__init__``)."""

    __slots__ = ()

    def __init__(self, *values, **named):
        name = type(self).__name__
        if len(values) > len(self.__slots__):
            raise TypeError("%s() takes %d values" % (name, len(self.__slots__)))
        given = dict(zip(self.__slots__, values))
        for key, value in named.items():
            if key not in self.__slots__ or key in given:
                raise TypeError("%s() got an unexpected or repeated %r" % (name, key))
            given[key] = value
        missing = [slot for slot in self.__slots__ if slot not in given]
        if missing:
            raise TypeError("%s() missing %s" % (name, ", ".join(missing)))
        for key, value in given.items():
            setattr(self, key, value)

    def _fields(self):
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other):
        return type(self) is type(other) and self._fields() == other._fields()

    def __hash__(self):
        return hash((type(self).__name__,) + self._fields())

    def __repr__(self):
        values = ", ".join("%s=%r" % (name, getattr(self, name)) for name in self.__slots__)
        return "%s(%s)" % (type(self).__name__, values)


class HandOff(_Value):
    """Insert the event's outbox record under ``id`` (``None``: the event's baseline ID)."""

    __slots__ = ("id",)

    def __init__(self, id=None):
        self.id = id


class Skip(_Value):
    """Move the checkpoint past the event without any record; the host logs the reason."""

    __slots__ = ("reason",)


class Quarantine(_Value):
    """Write a quarantine record (the event, its token and the reason) under ``id``."""

    __slots__ = ("id", "reason")


class Record(_Value):
    """An outbox record shaped by the policy (contract 1.2): a domain event.

    ``aggregate_id`` and ``aggregate_version`` are one Extended JSON value each (what
    ``event.field("documentKey._id")`` returns reads back as is); ``payload`` one document as
    Extended JSON text, or a ``dict`` that is serialized as JSON.
    """

    __slots__ = ("id", "event_type", "schema_version", "aggregate_id", "aggregate_version", "payload")

    def __init__(self, id, event_type, schema_version, aggregate_id, payload, aggregate_version=None):
        self.id = id
        self.event_type = event_type
        self.schema_version = schema_version
        self.aggregate_id = aggregate_id
        self.aggregate_version = aggregate_version
        self.payload = payload


def hand_off(id=None):
    """Hand the event off to the outbox under ``id``; without one, under the baseline's ID
    (``event.id``)."""
    return HandOff(id)


def skip(reason):
    """Move past the event without a record, for ``reason``."""
    return Skip(reason)


def quarantine(id, reason):
    """Write the event to the quarantine under ``id``, for ``reason``."""
    return Quarantine(id, reason)


def record(id, event_type, schema_version, aggregate_id, payload, aggregate_version=None):
    """Hand the event off as a policy-shaped outbox record (see :class:`Record`)."""
    return Record(id, event_type, schema_version, aggregate_id, payload, aggregate_version)


# Deliveries (contract 1.6) ---------------------------------------------------------------------
#
# ``handoff deliver --policy`` asks the policy what each outbox record's effect on the sink is,
# and what a failed attempt is, through two optional functions of the decisions module:
#
#     def effect(record):       # a DeliveryRecord: return a request, refuse(reason) or None
#         if record.field("event.operationType") == "delete":
#             return handoff.refuse("deletes are settled by hand")
#         return handoff.request(handoff.POST, body={"id": record.id, "kind": "order"})
#
#     def classify(failure):    # a DeliveryFailure: "retry", "dead", "ignore" or None
#         return handoff.IGNORE if failure.http_status == 409 else None
#
# ``None`` is the host's default (upsert by the source document's key at the event's cluster
# time, delete on deletes, the record itself as a webhook's body; transient failures retried).
# An answer depends on the record alone: no run exists while they are asked, and every call of
# the contract's host fails.

PROJECTION = "projection"
WEBHOOK = "webhook"
CACHE = "cache"
BROKER = "broker"

UPSERT = "upsert"
DELETE = "delete"
PUBLISH = "publish"
POST = "post"
IGNORE = "ignore"
OPERATIONS = (UPSERT, DELETE, PUBLISH, POST, IGNORE)

RETRY = "retry"
DEAD = "dead"
VERDICTS = (RETRY, DEAD, IGNORE)

_MAX_VERSION = 2**64 - 1


def _json_text(value):
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


class DeliveryRecord:
    """One outbox record on its way to a sink: the delivery's name (``--delivery``), the kind of
    sink (:data:`PROJECTION`, :data:`WEBHOOK`, …) and the record as canonical Extended JSON
    (``json``), readable as a dict (``document``) or by dotted path (:meth:`field`)."""

    __slots__ = ("delivery", "sink", "json", "_document")

    def __init__(self, delivery, sink, json_text):
        self.delivery = delivery
        self.sink = sink
        self.json = json_text
        self._document = None

    @property
    def document(self):
        """The record as a dict (Extended JSON values as they are written: ``{"$oid": …}``)."""
        if self._document is None:
            self._document = json.loads(self.json)
        return self._document

    @property
    def id(self):
        """The record's ``_id`` (``<consumer>/<event ID>``)."""
        return self.document.get("_id")

    def field(self, path):
        """The value at a dotted ``path`` (``"event.documentKey._id"``), ``None`` when absent."""
        value = self.document
        for part in path.split("."):
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return value

    def __repr__(self):
        return "DeliveryRecord(delivery=%r, sink=%r, id=%r)" % (self.delivery, self.sink, self.id)


class SinkRequest(_Value):
    """A record's effect on the sink: ``operation`` (one of :data:`OPERATIONS`), ``key`` (the
    key in the sink as Extended JSON text of one value, ``None``: the source document's key),
    ``version`` (``None``: the event's cluster time), ``body`` (a document as Extended JSON text,
    ``None``: the default's) and ``headers`` (pairs, for a webhook)."""

    __slots__ = ("operation", "key", "version", "body", "headers")


class Refuse(_Value):
    """The record must not reach the sink: it goes dead at once with the reason."""

    __slots__ = ("reason",)


class DeliveryFailure(_Value):
    """A failed delivery attempt: the record's ``_id``, the sink's kind, the attempt (from 1),
    whether the host would retry it, an HTTP sink's status and what happened."""

    __slots__ = ("record_id", "sink", "attempt", "transient", "http_status", "message")


def request(operation, key=None, version=None, body=None, headers=None):
    """A sink request. ``key`` is any JSON value (``"o-1"``, ``5``, ``{"$oid": "…"}``) or
    ``None``; ``body`` a dict (serialized as JSON) or Extended JSON text, or ``None``;
    ``headers`` a dict or pairs of strings. A wrong argument raises ``ValueError`` at once."""
    if operation not in OPERATIONS:
        raise ValueError("operation must be one of %s, not %r" % (", ".join(OPERATIONS), operation))
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= _MAX_VERSION
    ):
        raise ValueError("version must be an integer from 0 to 2^64 - 1, not %r" % (version,))
    if body is not None and not isinstance(body, str):
        if not isinstance(body, dict):
            raise ValueError("body must be a dict or Extended JSON text, not %s" % type(body).__name__)
        body = _json_text(body)
    if isinstance(headers, dict):
        headers = list(headers.items())
    pairs = []
    for pair in headers or ():
        if len(pair) != 2 or not all(isinstance(part, str) for part in pair):
            raise ValueError("headers are (name, value) pairs of strings, not %r" % (pair,))
        pairs.append((pair[0], pair[1]))
    return SinkRequest(operation, None if key is None else _json_text(key), version, body, pairs)


def refuse(reason):
    """Refuse the record for ``reason``: it goes dead without an effect."""
    return Refuse(str(reason))


def effect_of(decisions, record):
    """What ``decisions`` (a module or object with an optional ``effect``) makes of ``record``:
    ``None`` (the host's default), a :class:`SinkRequest` or a :class:`Refuse`. Anything else
    raises :class:`PolicyError`."""
    effect = getattr(decisions, "effect", None)
    if effect is None:
        return None
    answer = effect(record)
    if answer is None or isinstance(answer, (SinkRequest, Refuse)):
        return answer
    raise PolicyError(
        "effect() must return handoff.request(...), handoff.refuse(reason) or None, not %s"
        % type(answer).__name__
    )


def classify_failure(decisions, failure):
    """What ``decisions`` (with an optional ``classify``) makes of ``failure``: one of
    :data:`VERDICTS`, or ``None`` for what the host would do. Anything else raises
    :class:`PolicyError`."""
    classify = getattr(decisions, "classify", None)
    if classify is None:
        return None
    verdict = classify(failure)
    if verdict is None or verdict in VERDICTS:
        return verdict
    raise PolicyError("classify() must return %s or None, not %r" % (", ".join(map(repr, VERDICTS)), verdict))


# What a policy sees ---------------------------------------------------------------------------


class Settings(_Value):
    """The run's limits and the policy's parameters (``--policy-param key=value``).

    ``params`` is a dict (the first value of a repeated key, as the Rust SDK reads it);
    ``pairs`` keeps every pair in the order given.
    """

    __slots__ = ("max_events", "max_wait_ms", "params", "pairs")

    def __init__(self, max_events=50, max_wait_ms=10000, params=()):
        self.max_events = max_events
        self.max_wait_ms = max_wait_ms
        if isinstance(params, dict):
            params = list(params.items())
        self.pairs = [(str(k), str(v)) for k, v in params]
        self.params = {}
        for key, value in self.pairs:
            self.params.setdefault(key, value)

    def param(self, key, default=None):
        """A parameter by key, or ``default``."""
        return self.params.get(key, default)


class Event:
    """One delivered change event: its resume token, ``operation_type``, ``namespace``
    (``database.collection`` or ``None``), ``cluster_time`` (``(seconds, increment)`` or
    ``None``), its baseline ID ``id``, and any field through the host (:meth:`field`)."""

    __slots__ = ("token", "operation_type", "namespace", "cluster_time", "_id", "_host")

    def __init__(self, token, operation_type, namespace=None, cluster_time=None, host=None):
        self.token = token
        self.operation_type = operation_type
        self.namespace = namespace
        self.cluster_time = None if cluster_time is None else tuple(cluster_time)
        self._id = None
        self._host = host

    @property
    def id(self):
        """The baseline's event ID: SHA-256 of the token text, in lowercase hex."""
        if self._id is None:
            self._id = event_id(self.token)
        return self._id

    def field(self, path):
        """A field by dotted path (e.g. ``fullDocument.status``) as relaxed Extended JSON text,
        or ``None`` when the event has no such field."""
        if self._host is None:
            return None
        return self._host.field(self.token, path)

    def source_transaction(self):
        """Where the event stands in the MongoDB transaction that wrote it: a
        :class:`SourceTransaction` (``id``, ``index``, ``size``, ``size`` ``None`` for one of more
        than 500 events), or ``None`` when no transaction wrote it (contract 1.5). The host
        commits a transaction's events together, and the run reads past ``max_events`` to finish
        one."""
        if self._host is None:
            return None
        return self._host.source_transaction(self.token)

    def value(self, path, default=None):
        """A field parsed from its Extended JSON text (``{"$oid": ...}`` stays a dict), or
        ``default`` when absent."""
        text = self.field(path)
        return default if text is None else json.loads(text)

    def __repr__(self):
        return "Event(operation_type=%r, token=%r)" % (self.operation_type, self.token)


class SourceTransaction(_Value):
    """A delivered event's place in its source transaction: ``id`` (hex SHA-256 of its
    ``lsid`` and ``txnNumber``), ``index`` (from 0) and ``size`` (``None`` over 500 events)."""

    __slots__ = ("id", "index", "size")

    def __init__(self, id, index, size):
        self.id = id
        self.index = index
        self.size = size

    @property
    def inside(self):
        """More of the transaction follows this event."""
        return self.size is not None and self.index + 1 < self.size


class Checkpoint(_Value):
    """The checkpoint as loaded before the run: ``token`` (``None`` for a new consumer) and
    ``mode`` (``"resume-after"`` or ``"start-after"``)."""

    __slots__ = ("token", "mode")

    def __init__(self, token=None, mode=RESUME_AFTER):
        self.token = token
        self.mode = mode


class Deployment(_Value):
    """What the run is pinned to: ``consumer``, ``source`` (``database.collection``) and
    ``replica_set_id``."""

    __slots__ = ("consumer", "source", "replica_set_id")


class Report(_Value):
    """The end of a successful run: ``status`` (``"idle"``, ``"handed-off"`` or
    ``"invalidated"``), ``events_handed_off`` and ``last_event_id``."""

    __slots__ = ("status", "events_handed_off", "last_event_id")


class HostError(Exception):
    """A host call failed; the message is the host's, which keeps its classification."""


class PolicyError(Exception):
    """The policy ends the run with this message."""


# The host ---------------------------------------------------------------------------------------


class Host:
    """What the run loop needs of the host; :class:`FakeHost` and the component's adapter
    implement it. Starts and modes are strings: ``("now", None)``, ``("resume-after", token)``,
    ``("start-after", token)``; decisions are :class:`HandOff` (with its ID), :class:`Skip`,
    :class:`Quarantine` and :class:`Record`. Failures raise :class:`HostError`."""

    def deployment_identity(self):
        raise NotImplementedError

    def load_checkpoint(self):
        raise NotImplementedError

    def run_kind(self):
        """What the run reads: ``"changes"``, or a snapshot's documents (``"backfill"``,
        ``"repair"``)."""
        return CHANGES

    def open_stream(self, kind, token):
        raise NotImplementedError

    def next(self):
        """The next :class:`Event` or ``None``."""
        raise NotImplementedError

    def watermark(self):
        raise NotImplementedError

    def field(self, token, path):
        raise NotImplementedError

    def source_transaction(self, token):
        """Where a delivered event stands in its source transaction (contract 1.5)."""
        return None

    def follows(self):
        """Whether the run follows the stream until the host stops it (``run --follow``)."""
        return False

    def commit_batch(self, expected, next, mode, decisions):
        raise NotImplementedError

    def commit_records(self, expected, next, mode, decisions):
        raise NotImplementedError

    def advance_watermark(self, expected, next):
        raise NotImplementedError

    def monotonic_ms(self):
        raise NotImplementedError

    def log(self, level, message, fields):
        raise NotImplementedError


_current = {"host": None, "checkpoint": None}

#: How often a run that follows the stream saves its idle watermark, in milliseconds.
FOLLOW_WATERMARK_MS = 5000


def _host():
    host = _current["host"]
    if host is None:
        raise RuntimeError("no run in progress: the host is only reachable during init and decide")
    return host


class _Log:
    """``log.info("message", key=value, ...)``: a structured line through the host's logger (at
    most 1 KiB of message). Levels: trace, debug, info, warn (or warning), error."""

    LEVELS = ("trace", "debug", "info", "warn", "error")

    def __call__(self, level, message, **fields):
        if level == "warning":
            level = "warn"
        if level not in self.LEVELS:
            raise ValueError("unknown log level %r: one of %s" % (level, ", ".join(self.LEVELS)))
        _host().log(level, str(message), [(str(k), str(v)) for k, v in fields.items()])

    def trace(self, message, **fields):
        self("trace", message, **fields)

    def debug(self, message, **fields):
        self("debug", message, **fields)

    def info(self, message, **fields):
        self("info", message, **fields)

    def warn(self, message, **fields):
        self("warn", message, **fields)

    warning = warn

    def error(self, message, **fields):
        self("error", message, **fields)


log = _Log()


def deployment():
    """The :class:`Deployment` this run is pinned to."""
    return _host().deployment_identity()


def checkpoint():
    """The :class:`Checkpoint` as loaded at the start of this run."""
    _host()
    return _current["checkpoint"]


def run_kind():
    """What this run reads: ``"changes"`` (the change stream), ``"backfill"`` (the watched
    collection's existing documents) or ``"repair"`` (documents the outbox disagrees with, for
    ``reconcile``), the last two as ``snapshot`` events."""
    return _host().run_kind()


def monotonic_ms():
    """Milliseconds on the host's monotonic clock (virtual under a replay)."""
    return _host().monotonic_ms()


# The run --------------------------------------------------------------------------------------


def _decision(event, decided):
    """The decision ``decide`` returned, checked, with a hand-off's default ID filled in."""
    if isinstance(decided, HandOff):
        return HandOff(event.id if decided.id is None else decided.id)
    if isinstance(decided, (Skip, Quarantine, Record)):
        return decided
    raise PolicyError(
        "decide returned %r for event %s, not a decision (hand_off, skip, quarantine or record)"
        % (decided, event.id)
    )


def run(decisions, settings, host):
    """Drives one bounded run as the default policy does, each event (but an invalidation)
    becoming what ``decisions.decide(event)`` says; ``decisions.init(settings)`` first when
    defined. Returns the :class:`Report`; raises :class:`HostError` or :class:`PolicyError`."""
    if not isinstance(settings, Settings):
        raise TypeError("settings must be a handoff_policy.Settings")
    decide = getattr(decisions, "decide", None)
    if decide is None:
        raise PolicyError("the policy module defines no decide(event)")
    previous = dict(_current)
    _current["host"] = host
    try:
        init = getattr(decisions, "init", None)
        if init is not None:
            try:
                init(settings)
            except Exception as e:
                raise PolicyError("init refused the settings: %s" % _describe(e)) from e
        return _run(decide, settings, host)
    finally:
        _current.update(previous)


def _describe(error):
    text = str(error)
    return "%s: %s" % (type(error).__name__, text) if text else type(error).__name__


def _run(decide, settings, host):
    saved = host.load_checkpoint()
    _current["checkpoint"] = saved
    token = saved.token
    if token is None:
        host.open_stream("now", None)
    else:
        host.open_stream(saved.mode, token)
    events, handed_off, last_event_id, invalidated = 0, 0, "", False
    deadline = host.monotonic_ms() + settings.max_wait_ms
    # A run that follows the stream ends only when the host stops it; one inside a source
    # transaction reads past max_events to finish it (its rest is already read).
    follow, inside = host.follows(), False
    watermark_saved_at = host.monotonic_ms()
    while follow or inside or (events < settings.max_events and host.monotonic_ms() < deadline):
        event = host.next()
        if event is None:
            if follow and host.monotonic_ms() - watermark_saved_at >= FOLLOW_WATERMARK_MS:
                mark = host.watermark()
                if mark is not None and mark != token:
                    host.advance_watermark(token, mark)
                    token = mark
                watermark_saved_at = host.monotonic_ms()
            continue
        place = host.source_transaction(event.token)
        inside = place is not None and place.inside
        if event.operation_type == "invalidate":
            mode, decision = START_AFTER, Skip("invalidate")
        else:
            try:
                decided = decide(event)
            except Exception as e:
                raise PolicyError(
                    "decide failed on event %s (%s): %s" % (event.id, event.operation_type, _describe(e))
                ) from e
            mode, decision = RESUME_AFTER, _decision(event, decided)
        if isinstance(decision, Record):
            host.commit_records(token, event.token, mode, [decision])
        else:
            host.commit_batch(token, event.token, mode, [decision])
        events += 1
        token = event.token
        if mode == START_AFTER:
            # Like the baseline, an invalidated run reports the invalidate event's own ID.
            invalidated = True
            last_event_id = event.id
            break
        if isinstance(decision, (HandOff, Record)):
            handed_off += 1
            last_event_id = decision.id
        deadline = host.monotonic_ms() + settings.max_wait_ms
    if events < settings.max_events and not invalidated:
        mark = host.watermark()
        if mark is None and token is None:
            raise PolicyError(NO_IDLE_TOKEN)
        if mark is not None and mark != token:
            host.advance_watermark(token, mark)
    if invalidated:
        status = INVALIDATED
    elif handed_off > 0:
        status = HANDED_OFF
    else:
        status = IDLE
    return Report(status, handed_off, last_event_id)


# A host in memory -----------------------------------------------------------------------------


class FakeHost(Host):
    """A host in memory for native tests: ``events`` are delivered in order (each an
    :class:`Event`, or ``None`` for an empty wait, or an exception instance to raise), then
    nothing; ``fields`` maps ``(token, path)`` to Extended JSON text; ``watermark`` is what
    :meth:`watermark` reports once every event was delivered (default: the last event's token).

    It records ``commits`` (``(expected, next, mode, decisions)``), ``advanced`` watermarks and
    ``logs``, and enforces what the real host checks of the checkpoint's compare-and-set.

    ``transactions`` maps a token to its :class:`SourceTransaction`; ``follow`` is what
    :meth:`follows` answers (end such a script with an exception, as the host's refusal once it
    stops the run).

    ``kind`` is what :meth:`run_kind` answers. A snapshot run (``"backfill"``, ``"repair"``)
    starts without a token and its stream reports no watermark, as the host's; :meth:`snapshot`
    delivers its documents.
    """

    WAIT_MS = 1000

    def __init__(
        self,
        events=(),
        token=None,
        mode=RESUME_AFTER,
        watermark=None,
        fields=None,
        deployment=None,
        kind=CHANGES,
        transactions=None,
        follow=False,
    ):
        self.events = list(events)
        self.transactions = dict(transactions or {})
        self.follow = follow
        self.checkpoint = Checkpoint(token, mode)
        self.mark = watermark
        self.fields = dict(fields or {})
        self.identity = deployment or Deployment("orders-to-outbox", "change_demo.orders", "6740a1b2c3d4e5f601234567")
        self.kind = kind
        self.opened = None
        self.commits = []
        self.advanced = []
        self.logs = []
        self.clock = 0
        self._delivered = []

    def deployment_identity(self):
        return self.identity

    def load_checkpoint(self):
        return self.checkpoint

    def run_kind(self):
        return self.kind

    def snapshot(self, token, key, document):
        """Delivers a document next as a snapshot event: ``documentKey._id`` is ``key`` and
        ``fullDocument`` is ``document`` (Extended JSON text each, ``"null"`` for a document the
        source no longer holds). Returns the host."""
        self.events.append(Event(token, SNAPSHOT, self.identity.source))
        self.fields[(token, "documentKey._id")] = key
        self.fields[(token, "fullDocument")] = document
        return self

    def open_stream(self, kind, token):
        if self.opened is not None:
            raise HostError("at most one stream is open per run")
        if token != self.checkpoint.token:
            raise HostError("the start token is not the checkpoint's")
        self.opened = (kind, token)

    def next(self):
        if self.opened is None:
            raise HostError("stream not open")
        if not self.events:
            self.clock += self.WAIT_MS
            return None
        event = self.events.pop(0)
        if event is None:
            self.clock += self.WAIT_MS
            return None
        if isinstance(event, BaseException):
            raise event
        event._host = self
        self._delivered.append(event)
        return event

    def watermark(self):
        if self.kind != CHANGES:
            return None
        if self.mark is not None and not self.events:
            return self.mark
        return self._delivered[-1].token if self._delivered else None

    def field(self, token, path):
        return self.fields.get((token, path))

    def source_transaction(self, token):
        return self.transactions.get(token)

    def follows(self):
        return self.follow

    def _commit(self, expected, next, mode, decisions):
        if expected != self.checkpoint.token:
            raise HostError("conflict: the checkpoint is not at the expected token")
        if not any(e.token == next for e in self._delivered):
            raise HostError("rejected: %r was not delivered" % (next,))
        self.commits.append((expected, next, mode, list(decisions)))
        self.checkpoint = Checkpoint(next, mode)

    def commit_batch(self, expected, next, mode, decisions):
        if any(isinstance(d, Record) for d in decisions):
            raise HostError("rejected: commit-batch carries no shaped record")
        self._commit(expected, next, mode, decisions)

    def commit_records(self, expected, next, mode, decisions):
        self._commit(expected, next, mode, decisions)

    def advance_watermark(self, expected, next):
        if expected != self.checkpoint.token:
            raise HostError("conflict: the checkpoint is not at the expected token")
        self.advanced.append((expected, next))
        self.checkpoint = Checkpoint(next, RESUME_AFTER)

    def monotonic_ms(self):
        return self.clock

    def log(self, level, message, fields):
        self.logs.append((level, message, list(fields)))

    def outbox(self):
        """The IDs handed off so far, in order."""
        return [d.id for _, _, _, ds in self.commits for d in ds if isinstance(d, (HandOff, Record))]


# The component --------------------------------------------------------------------------------
#
# Under componentize-py the contract's bindings (`wit_world`) exist: the adapter below turns them
# into a Host, and `Policy` is the export. Natively they do not, and none of this is defined.

try:
    from wit_world.exports import Policy as _PolicyExport
    from wit_world.imports import host as _wit
    from wit_world.imports import types as _types
    from componentize_py_types import Err as _Err
except ImportError:
    _PolicyExport = None

# Built with world `effects-policy` (contract 1.6) the component also exports `delivery`.
try:
    from wit_world.exports import Delivery as _DeliveryExport
    from wit_world.exports import delivery as _delivery
except ImportError:
    _DeliveryExport = None

if _PolicyExport is not None:
    _MODES = {RESUME_AFTER: _types.ResumeMode.RESUME_AFTER, START_AFTER: _types.ResumeMode.START_AFTER}
    _LEVELS = {
        "trace": _types.LogLevel.TRACE,
        "debug": _types.LogLevel.DEBUG,
        "info": _types.LogLevel.INFO,
        "warn": _types.LogLevel.WARN,
        "error": _types.LogLevel.ERROR,
    }
    _KINDS = {
        _types.RunKind.CHANGES: CHANGES,
        _types.RunKind.BACKFILL: BACKFILL,
        _types.RunKind.REPAIR: REPAIR,
    }
    _STATUS = {
        IDLE: _types.RunStatus.IDLE,
        HANDED_OFF: _types.RunStatus.HANDED_OFF,
        INVALIDATED: _types.RunStatus.INVALIDATED,
    }

    def _committed(commit, request):
        """Calls the host's ``commit`` with ``request``; a refusal raises as the host worded it."""
        try:
            commit(request)
        except _Err as e:
            raise _failed(e) from None

    def _failed(error):
        # Every stream and commit error carries the host's message.
        return HostError(error.value.value)

    def _event_decision(d):
        if isinstance(d, HandOff):
            return _types.EventDecision_HandOff(d.id)
        if isinstance(d, Skip):
            return _types.EventDecision_Skip(d.reason)
        return _types.EventDecision_Quarantine(_types.QuarantineDecision(d.id, d.reason))

    def _record_decision(d):
        if isinstance(d, HandOff):
            return _types.RecordDecision_HandOff(d.id)
        if isinstance(d, Skip):
            return _types.RecordDecision_Skip(d.reason)
        if isinstance(d, Quarantine):
            return _types.RecordDecision_Quarantine(_types.QuarantineDecision(d.id, d.reason))
        payload = d.payload
        if not isinstance(payload, str):
            payload = json.dumps(payload, separators=(",", ":"), sort_keys=True)
        return _types.RecordDecision_HandOffRecord(
            _types.OutboxRecord(
                d.id, d.event_type, d.schema_version, d.aggregate_id, d.aggregate_version, payload
            )
        )

    class WitHost(Host):
        """The contract's imports as a :class:`Host`."""

        def __init__(self):
            self.stream = None

        def deployment_identity(self):
            d = _wit.deployment_identity()
            return Deployment(d.consumer, d.source, d.replica_set_id)

        def load_checkpoint(self):
            c = _wit.load_checkpoint()
            mode = START_AFTER if c.mode == _types.ResumeMode.START_AFTER else RESUME_AFTER
            return Checkpoint(c.token, mode)

        def run_kind(self):
            return _KINDS[_wit.kind_of_run()]

        def open_stream(self, kind, token):
            if kind == "now":
                start = _types.StreamStart_Now()
            elif kind == START_AFTER:
                start = _types.StreamStart_StartAfter(token)
            else:
                start = _types.StreamStart_ResumeAfter(token)
            try:
                self.stream = _wit.open_stream(start)
            except _Err as e:
                raise _failed(e) from None

        def next(self):
            if self.stream is None:
                raise HostError("stream not open")
            try:
                e = self.stream.next()
            except _Err as error:
                raise _failed(error) from None
            if e is None:
                return None
            return Event(e.token, e.operation_type, e.namespace, e.cluster_time, self)

        def watermark(self):
            return None if self.stream is None else self.stream.watermark()

        def source_transaction(self, token):
            t = _wit.source_transaction_of(token)
            return None if t is None else SourceTransaction(t.id, t.index, t.size)

        def follows(self):
            return _wit.follows()

        def field(self, token, path):
            if self.stream is None:
                return None
            return self.stream.field(token, path)

        def commit_batch(self, expected, next, mode, decisions):
            request = _types.BatchRequest(expected, next, _MODES[mode], [_event_decision(d) for d in decisions])
            _committed(_wit.commit_batch, request)

        def commit_records(self, expected, next, mode, decisions):
            request = _types.RecordsRequest(expected, next, _MODES[mode], [_record_decision(d) for d in decisions])
            _committed(_wit.commit_records, request)

        def advance_watermark(self, expected, next):
            try:
                _wit.advance_watermark(expected, next)
            except _Err as e:
                raise _failed(e) from None

        def monotonic_ms(self):
            return _wit.monotonic_ms()

        def log(self, level, message, fields):
            _wit.log(_LEVELS[level], message, fields)

        def close(self):
            """Gives the stream back to the host."""
            if self.stream is not None:
                stream, self.stream = self.stream, None
                stream.__exit__(None, None, None)

    # The author's decisions: imported now, so that the component is built with them.
    import policy as _decisions

    class Policy(_PolicyExport):
        """The component's export: one run over the contract's imports."""

        def run(self, settings):
            host = WitHost()
            try:
                report = run(
                    _decisions,
                    Settings(settings.max_events, settings.max_wait_ms, settings.params),
                    host,
                )
                host.close()
            except (HostError, PolicyError) as e:
                raise _Err(str(e)) from None
            except Exception as e:
                raise _Err("the policy failed: %s" % _describe(e)) from None
            return _types.Report(_STATUS[report.status], report.events_handed_off, report.last_event_id)

if _PolicyExport is not None and _DeliveryExport is not None:
    _SINKS = {
        _delivery.SinkKind.PROJECTION: PROJECTION,
        _delivery.SinkKind.WEBHOOK: WEBHOOK,
        _delivery.SinkKind.CACHE: CACHE,
        _delivery.SinkKind.BROKER: BROKER,
    }
    _OPERATIONS = {
        UPSERT: _delivery.Operation.UPSERT,
        DELETE: _delivery.Operation.DELETE,
        PUBLISH: _delivery.Operation.PUBLISH,
        POST: _delivery.Operation.POST,
        IGNORE: _delivery.Operation.IGNORE,
    }
    _VERDICTS = {
        RETRY: _delivery.Verdict.RETRY,
        DEAD: _delivery.Verdict.DEAD,
        IGNORE: _delivery.Verdict.IGNORE,
    }

    class Delivery(_DeliveryExport):
        """The component's `delivery` export: the decisions module's ``effect`` and ``classify``.
        An exception traps: the host ends the delivery there, and the record stays unsettled."""

        def effect_of(self, outbox):
            answer = effect_of(_decisions, DeliveryRecord(outbox.delivery, _SINKS[outbox.sink], outbox.json))
            if answer is None:
                return _delivery.Effect_DefaultEffect()
            if isinstance(answer, Refuse):
                return _delivery.Effect_Refuse(answer.reason)
            return _delivery.Effect_Request(
                _delivery.SinkRequest(
                    _OPERATIONS[answer.operation], answer.key, answer.version, answer.body, list(answer.headers)
                )
            )

        def classify(self, failure):
            verdict = classify_failure(
                _decisions,
                DeliveryFailure(
                    failure.record_id,
                    _SINKS[failure.sink],
                    failure.attempt,
                    failure.transient,
                    failure.http_status,
                    failure.message,
                ),
            )
            return None if verdict is None else _VERDICTS[verdict]
