// A host for unit tests: a scripted stream, the commits it received and a virtual clock, with the
// shape of the contract's imports as the component sees them (u64 as BigInt, variants as
// `{tag, val}`, errors thrown with the variant as `payload`).

/** A delivered event in the contract's form, with optional fields for `field(path)`. */
export function delivered(token, operationType = 'insert', fields = {}) {
  return {
    token,
    operationType,
    namespace: 'shop.orders',
    clusterTime: [1700000000, 1],
    fields,
  };
}

/**
 * A document of a snapshot run as a delivered event: `documentKey._id` is `key` and
 * `fullDocument` is `document` (Extended JSON text each, `'null'` for a document the source no
 * longer holds).
 */
export function snapshotDocument(token, key, document) {
  return delivered(token, 'snapshot', { 'documentKey._id': key, fullDocument: document });
}

/** A host error as the component sees it (`ComponentError` with the variant as payload). */
export function hostError(tag, message) {
  const error = new Error(message);
  error.payload = { tag, val: message };
  return error;
}

/**
 * A fake host: `script` is what `next()` returns in turn (an event, `null` for "nothing yet", an
 * Error to throw); `watermark` what the stream reports at the end; `kind` what `kindOfRun()`
 * answers; `transactions` maps a token to its `{ id, index, size }` in a source transaction;
 * `follow` what `follows()` answers (end such a script with an Error). A snapshot run (`'backfill'`, `'repair'`) delivers `snapshotDocument`s and its stream
 * reports no watermark, as the host's.
 */
export function fakeHost({
  script = [],
  checkpoint = {},
  watermark,
  awaitMs = 1000n,
  kind = 'changes',
  transactions = {},
  follow = false,
} = {}) {
  const calls = { opened: [], commits: [], advanced: [], logs: [] };
  const pending = [...script];
  let clock = 0n;
  const delivered = new Map();
  const stream = {
    next() {
      if (pending.length === 0) {
        clock += awaitMs;
        return undefined;
      }
      const item = pending.shift();
      if (item instanceof Error) {
        throw item;
      }
      if (item === null) {
        clock += awaitMs;
        return undefined;
      }
      delivered.set(item.token, item);
      const { fields, ...event } = item;
      return event;
    },
    watermark() {
      return kind === 'changes' ? watermark : undefined;
    },
    field(token, path) {
      return delivered.get(token)?.fields?.[path];
    },
  };
  const host = {
    calls,
    deploymentIdentity: () => ({ consumer: 'c1', source: 'shop.orders', replicaSetId: '65f0a1b2c3d4e5f601234567' }),
    loadCheckpoint: () => ({ token: checkpoint.token, mode: checkpoint.mode ?? 'resume-after' }),
    kindOfRun: () => kind,
    sourceTransactionOf: (token) => transactions[token],
    follows: () => follow,
    openStream(start) {
      calls.opened.push(start);
      return stream;
    },
    commitBatch(request) {
      calls.commits.push({ via: 'commit-batch', ...request });
    },
    commitRecords(request) {
      calls.commits.push({ via: 'commit-records', ...request });
    },
    advanceWatermark(expected, next) {
      calls.advanced.push([expected, next]);
    },
    monotonicMs: () => clock,
    log(level, message, fields) {
      calls.logs.push([level, message, fields]);
    },
  };
  return host;
}

/** The contract's settings. */
export function settings(maxEvents = 100, maxWaitMs = 5000n, params = []) {
  return { maxEvents, maxWaitMs, params };
}
