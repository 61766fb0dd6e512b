// The handoff policy SDK for JavaScript.
//
// It owns the run loop of the default policy (the baseline task): the stream opens where the
// checkpoint says, every event is committed on its own (`commit-batch` with one decision), an
// invalidation is skipped, saved with `start-after` and ends the run, and an idle run saves the
// stream's watermark without ever leaving an uncheckpointed gap. A policy only writes
// `decide(event, context)` (and, if it has parameters, `init(settings)`).
//
// The same `decide` says what becomes of the documents operator commands read from the watched
// collection (contract 1.3): `handoff backfill` and `handoff reconcile --repair` drive snapshot
// runs through the same run loop, in which each document is an event whose `operationType` is
// `snapshot` (`fullDocument` is the document as read, `null` for a correction of a document the
// source no longer holds); `runKind()` tells the runs apart.
//
// The module does not import the contract itself: `component.js` binds the component's imports
// (`handoff:policy/host`) with `exportPolicy`, and tests bind a fake host with `bindHost`. The
// host object has the shape of those imports: deploymentIdentity, loadCheckpoint, kindOfRun,
// openStream (returning a stream with next, watermark and field), commitBatch, commitRecords,
// advanceWatermark, monotonicMs and log, with the contract's values (u64 as BigInt, variants as
// `{tag, val}`, enums as strings, options as `undefined`, errors thrown with the variant as
// `payload`).

let bound = null;

/** Binds the host the SDK calls (the contract's imports, or a fake one in tests). */
export function bindHost(host) {
  bound = host;
}

function host() {
  if (bound === null) {
    throw new Error('no host is bound: the SDK runs inside the component or after bindHost()');
  }
  return bound;
}

/** The log levels of the contract, lowest first. */
export const LOG_LEVELS = Object.freeze(['trace', 'debug', 'info', 'warn', 'error']);

function writeLog(level, message, fields) {
  const pairs = Object.entries(fields ?? {}).map(([key, value]) => [String(key), String(value)]);
  host().log(level, String(message), pairs);
}

/**
 * Structured log lines through the host's logger (messages are truncated to 1 KiB by the host):
 * `log.info('message', { key: 'value' })`.
 */
export const log = Object.freeze({
  trace: (message, fields) => writeLog('trace', message, fields),
  debug: (message, fields) => writeLog('debug', message, fields),
  info: (message, fields) => writeLog('info', message, fields),
  warn: (message, fields) => writeLog('warn', message, fields),
  error: (message, fields) => writeLog('error', message, fields),
});

/** The deployment this run is pinned to: `{ consumer, source, replicaSetId }`. */
export function deployment() {
  const { consumer, source, replicaSetId } = host().deploymentIdentity();
  return { consumer, source, replicaSetId };
}

/** The checkpoint as loaded before the run: `{ token, mode }` (`token` undefined when none). */
export function checkpoint() {
  const { token, mode } = host().loadCheckpoint();
  return { token: token ?? undefined, mode };
}

/**
 * What this run reads: `'changes'` (the change stream), `'backfill'` (the watched collection's
 * existing documents) or `'repair'` (documents the outbox disagrees with, for `reconcile`), the
 * last two as `snapshot` events.
 */
export function runKind() {
  return host().kindOfRun();
}

/** Milliseconds on the host's monotonic clock (virtual in a replay), as a Number. */
export function monotonicMs() {
  return Number(host().monotonicMs());
}

/** Lowercase hex SHA-256 of a text's UTF-8 bytes, through the Web Crypto API. */
export async function sha256Hex(text) {
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(text));
  let hex = '';
  for (const byte of new Uint8Array(digest)) {
    hex += byte.toString(16).padStart(2, '0');
  }
  return hex;
}

/** The baseline's event ID: lowercase hex SHA-256 of the token text as given. */
export function eventId(token) {
  return sha256Hex(token);
}

const DECISION = Symbol('handoff decision');

/** Hands the event off to the outbox under `id` (default: the baseline's event ID). */
export function handOff(id) {
  return { [DECISION]: 'hand-off', id };
}

/** Moves the checkpoint past the event without any record; the host logs `reason`. */
export function skip(reason) {
  return { [DECISION]: 'skip', reason: String(reason) };
}

/** Writes a quarantine record (the event as delivered, its token and `reason`) under `id`. */
export function quarantine(id, reason) {
  return { [DECISION]: 'quarantine', id, reason: String(reason) };
}

/**
 * Hands the event off as a policy-shaped outbox record (a domain event, contract 1.2):
 * `{ id, eventType, schemaVersion, aggregateId, aggregateVersion, payload }`, where `id`
 * defaults to the baseline's event ID, `aggregateId` and `aggregateVersion` are one Extended
 * JSON value each (what `event.field` returns) and `payload` is a document as Extended JSON text
 * or an object (serialized with JSON.stringify).
 */
export function record(fields) {
  return { [DECISION]: 'record', ...fields };
}

/** How often a run that follows the stream saves its idle watermark, in milliseconds. */
export const FOLLOW_WATERMARK_MS = 5000n;

/** One delivered change event as `decide` sees it. */
export class Event {
  #stream;

  constructor(delivered, id, stream) {
    /** The resume token's text (opaque: only hashed or passed back). */
    this.token = delivered.token;
    /** `operationType`: insert, update, replace, delete, drop, rename, dropDatabase, snapshot, ... */
    this.operationType = delivered.operationType;
    /** `ns` as `database.collection`, or undefined. */
    this.namespace = delivered.namespace ?? undefined;
    const time = delivered.clusterTime;
    /** `clusterTime` as `{ seconds, increment }`, or undefined. */
    this.clusterTime = time == null ? undefined : { seconds: time[0], increment: time[1] };
    /** The baseline's event ID (SHA-256 of the token text). */
    this.id = id;
    this.#stream = stream;
  }

  /**
   * A field of the event by dotted path (e.g. `fullDocument.status`) as relaxed Extended JSON
   * text, or undefined when absent. `JSON.parse` reads it.
   */
  field(path) {
    return this.#stream.field(this.token, String(path)) ?? undefined;
  }
}

/** A policy's run settings: `{ maxEvents, maxWaitMs, params, param(key) }`. */
export class Settings {
  constructor(settings) {
    this.maxEvents = settings.maxEvents;
    this.maxWaitMs = Number(settings.maxWaitMs);
    /** `--policy-param key=value` pairs, as an object (the last value of a key wins). */
    this.params = Object.fromEntries(settings.params);
  }

  /** A parameter's value, or `fallback` when it is not given. */
  param(key, fallback = undefined) {
    return Object.hasOwn(this.params, key) ? this.params[key] : fallback;
  }
}

/** The message of anything thrown: a host error's variant message, an Error's message. */
export function message(error) {
  const payload = error?.payload;
  if (payload !== undefined && payload !== null) {
    return typeof payload === 'object' && 'val' in payload ? String(payload.val) : String(payload);
  }
  if (error instanceof Error) {
    return error.message;
  }
  return String(error);
}

const ID = /^[A-Za-z0-9._:-]{1,200}$/;

function checkId(id, what) {
  if (typeof id !== 'string' || !ID.test(id)) {
    throw new Error(`${what} must be 1 to 200 characters from [A-Za-z0-9._:-], not ${JSON.stringify(id)}`);
  }
  return id;
}

// The contract's form of a decision, and whether it needs `commit-records`.
function contractDecision(decision, event) {
  const kind = decision?.[DECISION];
  switch (kind) {
    case 'hand-off':
      return { tag: 'hand-off', val: checkId(decision.id ?? event.id, 'a hand-off ID') };
    case 'skip':
      return { tag: 'skip', val: decision.reason };
    case 'quarantine':
      return {
        tag: 'quarantine',
        val: { id: checkId(decision.id ?? event.id, 'a quarantine ID'), reason: decision.reason },
      };
    case 'record': {
      const payload =
        typeof decision.payload === 'string' ? decision.payload : JSON.stringify(decision.payload ?? {});
      return {
        tag: 'hand-off-record',
        val: {
          id: checkId(decision.id ?? event.id, 'a record ID'),
          eventType: String(decision.eventType),
          schemaVersion: Number(decision.schemaVersion ?? 1),
          aggregateId: String(decision.aggregateId),
          aggregateVersion: decision.aggregateVersion == null ? undefined : String(decision.aggregateVersion),
          payload,
        },
      };
    }
    default:
      throw new Error(
        `decide must return handOff(), skip(reason), quarantine(id, reason) or record({...}), ` +
          `not ${JSON.stringify(decision)} (event ${event.id})`,
      );
  }
}

const NO_IDLE_TOKEN =
  'MongoDB did not provide an idle resume token; refusing to leave an uncheckpointed gap';

/**
 * One bounded run, exactly the default policy's: `policy` is the module holding `decide` (and
 * optionally `init`), `settings` the contract's settings. Resolves to the contract's report;
 * rejects with the message of what failed.
 */
export async function run(policy, settings) {
  if (typeof policy?.decide !== 'function') {
    throw new Error('the policy module must export a function decide(event, context)');
  }
  const h = host();
  const config = new Settings(settings);
  const context = typeof policy.init === 'function' ? await policy.init(config) : undefined;

  const saved = h.loadCheckpoint();
  let token = saved.token ?? undefined;
  const start = token === undefined ? { tag: 'now' } : { tag: saved.mode, val: token };
  const stream = h.openStream(start);
  const maxWait = BigInt(settings.maxWaitMs);
  const now = () => BigInt(h.monotonicMs());

  let events = 0;
  let handedOff = 0;
  let lastEventId = '';
  let invalidated = false;
  let deadline = now() + maxWait;
  // A run that follows the stream ends only when the host stops it; one inside a source
  // transaction reads past maxEvents to finish it (its rest is already read).
  const follow = typeof h.follows === 'function' && h.follows();
  let inside = false;
  let watermarkSavedAt = now();
  while (follow || inside || (events < settings.maxEvents && now() < deadline)) {
    const delivered = stream.next();
    if (delivered == null) {
      if (follow && now() - watermarkSavedAt >= FOLLOW_WATERMARK_MS) {
        const mark = stream.watermark() ?? undefined;
        if (mark !== undefined && mark !== token) {
          h.advanceWatermark(token, mark);
          token = mark;
        }
        watermarkSavedAt = now();
      }
      continue;
    }
    const event = new Event(delivered, await eventId(delivered.token), stream);
    const place =
      typeof h.sourceTransactionOf === 'function' ? h.sourceTransactionOf(event.token) : undefined;
    if (place != null) {
      /** Where the event stands in its source transaction: `{ id, index, size }` (contract 1.5). */
      event.sourceTransaction = { id: place.id, index: place.index, size: place.size ?? undefined };
    }
    inside = place != null && place.size != null && place.index + 1 < place.size;
    const invalidate = event.operationType === 'invalidate';
    const decision = invalidate
      ? { tag: 'skip', val: 'invalidate' }
      : contractDecision(await policy.decide(event, context), event);
    const request = {
      expected: token,
      next: event.token,
      mode: invalidate ? 'start-after' : 'resume-after',
      decisions: [decision],
    };
    if (decision.tag === 'hand-off-record') {
      h.commitRecords(request);
    } else {
      h.commitBatch(request);
    }
    events += 1;
    token = event.token;
    if (invalidate) {
      // Like the baseline, an invalidated run reports the invalidate event's own ID.
      invalidated = true;
      lastEventId = event.id;
      break;
    }
    if (decision.tag === 'hand-off') {
      handedOff += 1;
      lastEventId = decision.val;
    } else if (decision.tag === 'hand-off-record') {
      handedOff += 1;
      lastEventId = decision.val.id;
    }
    deadline = now() + maxWait;
  }

  if (events < settings.maxEvents && !invalidated) {
    const mark = stream.watermark() ?? undefined;
    if (mark === undefined && token === undefined) {
      throw new Error(NO_IDLE_TOKEN);
    }
    if (mark !== undefined && mark !== token) {
      h.advanceWatermark(token, mark);
    }
  }
  const status = invalidated ? 'invalidated' : handedOff > 0 ? 'handed-off' : 'idle';
  return { status, eventsHandedOff: handedOff, lastEventId };
}

/**
 * The component's `handoff:policy/policy` export for a policy module, on the given host (the
 * contract's imports): `export const policy = exportPolicy(host, decisions)`.
 */
export function exportPolicy(contractHost, policy) {
  return {
    async run(settings) {
      bindHost(contractHost);
      try {
        return await run(policy, settings);
      } catch (error) {
        // The contract's error is a string.
        throw message(error);
      }
    },
  };
}

// Deliveries (contract 1.6) ---------------------------------------------------------------------
//
// `handoff deliver --policy` asks the policy what each outbox record's effect on the sink is, and
// what a failed attempt is, through two optional exports of the decisions module:
//
//   export function effect(record) {      // a DeliveryRecord: request(...), refuse(reason) or undefined
//     return request({ operation: 'post', body: { id: record.id } });
//   }
//   export function classify(failure) {   // 'retry', 'dead', 'ignore' or undefined
//     return failure.httpStatus === 409 ? 'ignore' : undefined;
//   }
//
// `undefined` is the host's default (upsert by the source document's key at the event's cluster
// time, delete on deletes, the record itself as a webhook's body; transient failures retried). An
// answer depends on the record alone: no run exists while they are asked, and the host's
// functions all fail.

/** The operations of a sink request. */
export const OPERATIONS = Object.freeze(['upsert', 'delete', 'publish', 'post', 'ignore']);
/** What a failed attempt may become. */
export const VERDICTS = Object.freeze(['retry', 'dead', 'ignore']);

const EFFECT = Symbol('handoff effect');
const MAX_VERSION = (1n << 64n) - 1n;

/** One outbox record on its way to a sink: `delivery`, `sink` (its kind) and `json`. */
export class DeliveryRecord {
  #document;

  constructor(delivery, sink, json) {
    this.delivery = delivery;
    this.sink = sink;
    this.json = json;
  }

  /** The record as an object (Extended JSON values as written: `{ $oid: … }`). */
  get document() {
    this.#document ??= JSON.parse(this.json);
    return this.#document;
  }

  /** The record's `_id` (`<consumer>/<event ID>`). */
  get id() {
    return this.document._id;
  }

  /** The value at a dotted path (`'event.documentKey._id'`), `undefined` when absent. */
  field(path) {
    let value = this.document;
    for (const part of String(path).split('.')) {
      if (value === null || typeof value !== 'object' || !Object.hasOwn(value, part)) {
        return undefined;
      }
      value = value[part];
    }
    return value;
  }
}

/**
 * A sink request: `{ operation, key, version, body, headers }`. `key` is any JSON value (the
 * key in the sink; `undefined`: the source document's key), `version` an integer from 0 to
 * 2^64 - 1 (`undefined`: the event's cluster time), `body` an object (serialized as JSON) or
 * Extended JSON text (`undefined`: the default's), `headers` an object or `[name, value]` pairs.
 * A wrong argument throws at once.
 */
export function request({ operation, key, version, body, headers } = {}) {
  if (!OPERATIONS.includes(operation)) {
    throw new TypeError(`operation must be one of ${OPERATIONS.join(', ')}, not ${String(operation)}`);
  }
  let v;
  if (version !== undefined && version !== null) {
    const integer = typeof version === 'bigint' || Number.isSafeInteger(version);
    v = integer ? BigInt(version) : -1n;
    if (v < 0n || v > MAX_VERSION) {
      throw new TypeError(`version must be an integer from 0 to 2^64 - 1, not ${String(version)}`);
    }
  }
  let text;
  if (body !== undefined && body !== null) {
    if (typeof body === 'string') {
      text = body;
    } else if (typeof body === 'object' && !Array.isArray(body)) {
      text = JSON.stringify(body);
    } else {
      throw new TypeError('body must be an object or Extended JSON text');
    }
  }
  const pairs = [];
  const given = headers === undefined || headers === null ? [] : Array.isArray(headers) ? headers : Object.entries(headers);
  for (const pair of given) {
    if (!Array.isArray(pair) || pair.length !== 2 || pair.some((part) => typeof part !== 'string')) {
      throw new TypeError('headers are [name, value] pairs of strings');
    }
    pairs.push([pair[0], pair[1]]);
  }
  return {
    [EFFECT]: 'request',
    operation,
    key: key === undefined || key === null ? undefined : JSON.stringify(key),
    version: v,
    body: text,
    headers: pairs,
  };
}

/** Refuses the record for `reason`: it goes dead without an effect. */
export function refuse(reason) {
  return { [EFFECT]: 'refuse', reason: String(reason) };
}

/**
 * What `policy` (a module with an optional `effect`) makes of `record`, as the contract's
 * `effect` variant. An answer that is not `request(...)`, `refuse(...)` or `undefined` throws.
 */
export function effectOf(policy, record) {
  if (typeof policy.effect !== 'function') {
    return { tag: 'default-effect' };
  }
  const answer = policy.effect(record);
  if (answer === undefined || answer === null) {
    return { tag: 'default-effect' };
  }
  if (answer[EFFECT] === 'refuse') {
    return { tag: 'refuse', val: answer.reason };
  }
  if (answer[EFFECT] === 'request') {
    const { operation, key, version, body, headers } = answer;
    return { tag: 'request', val: { operation, key, version, body, headers } };
  }
  throw new TypeError('effect() must return request(...), refuse(reason) or undefined');
}

/**
 * What `policy` (with an optional `classify`) makes of a failed attempt: one of `VERDICTS`, or
 * `undefined` for what the host would do. Any other answer throws.
 */
export function classifyFailure(policy, failure) {
  if (typeof policy.classify !== 'function') {
    return undefined;
  }
  const verdict = policy.classify(failure);
  if (verdict === undefined || verdict === null) {
    return undefined;
  }
  if (!VERDICTS.includes(verdict)) {
    throw new TypeError(`classify() must return ${VERDICTS.join(', ')} or undefined, not ${String(verdict)}`);
  }
  return verdict;
}

/**
 * The component's `handoff:policy/delivery` export for a policy module:
 * `export const delivery = exportDelivery(decisions)`. A policy that throws traps: the host ends
 * the delivery there, and the record stays unsettled.
 */
export function exportDelivery(policy) {
  return {
    effectOf(outbox) {
      return effectOf(policy, new DeliveryRecord(outbox.delivery, outbox.sink, outbox.json));
    },
    classify(failure) {
      return classifyFailure(policy, { ...failure });
    },
  };
}
