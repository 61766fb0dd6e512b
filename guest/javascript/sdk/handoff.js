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
