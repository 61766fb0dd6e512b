// The SDK's run loop against a fake host: the default policy's semantics, decision by decision.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import {
  DeliveryRecord,
  bindHost,
  checkpoint,
  classifyFailure,
  effectOf,
  exportDelivery,
  deployment,
  eventId,
  exportPolicy,
  handOff,
  log,
  message,
  quarantine,
  record,
  refuse,
  request,
  run,
  runKind,
  skip,
} from './handoff.js';
import { delivered, fakeHost, hostError, settings, snapshotDocument } from './fake-host.js';

const handAll = { decide: (event) => handOff() };

async function runWith(host, policy = handAll, s = settings()) {
  bindHost(host);
  return run(policy, s);
}

test('event IDs are the baseline vectors (SHA-256 of the canonical token text PyMongo prints)', async () => {
  const url = new URL('../../../tests/fixtures/event-id-vectors.json', import.meta.url);
  const vectors = JSON.parse(readFileSync(url, 'utf8'));
  assert.ok(vectors.length > 0);
  for (const vector of vectors) {
    assert.equal(await eventId(vector.pymongo_dumps_sort_keys), vector.event_id, vector.name);
  }
  assert.equal(await eventId(''), 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
});

test('a fresh consumer starts now, hands every event off and saves the idle watermark', async () => {
  const host = fakeHost({ script: [delivered('T1'), delivered('T2', 'delete')], watermark: 'W' });
  const report = await runWith(host);
  assert.deepEqual(host.calls.opened, [{ tag: 'now' }]);
  assert.deepEqual(host.calls.commits, [
    { via: 'commit-batch', expected: undefined, next: 'T1', mode: 'resume-after', decisions: [{ tag: 'hand-off', val: await eventId('T1') }] },
    { via: 'commit-batch', expected: 'T1', next: 'T2', mode: 'resume-after', decisions: [{ tag: 'hand-off', val: await eventId('T2') }] },
  ]);
  assert.deepEqual(host.calls.advanced, [['T2', 'W']]);
  assert.deepEqual(report, { status: 'handed-off', eventsHandedOff: 2, lastEventId: await eventId('T2') });
});

test('the stream resumes as the checkpoint says', async () => {
  for (const mode of ['resume-after', 'start-after']) {
    const host = fakeHost({ checkpoint: { token: 'T0', mode }, watermark: 'T0' });
    const report = await runWith(host);
    assert.deepEqual(host.calls.opened, [{ tag: mode, val: 'T0' }]);
    assert.deepEqual(host.calls.advanced, [], 'a watermark equal to the token is not saved');
    assert.deepEqual(report, { status: 'idle', eventsHandedOff: 0, lastEventId: '' });
  }
});

test('an invalidation is skipped, saved with start-after and ends the run without a watermark', async () => {
  const host = fakeHost({
    script: [delivered('T1'), delivered('I', 'invalidate'), delivered('T3')],
    watermark: 'W',
  });
  const seen = [];
  const report = await runWith(host, { decide: (event) => (seen.push(event.operationType), handOff()) });
  assert.deepEqual(seen, ['insert'], 'decide never sees the invalidation');
  assert.deepEqual(host.calls.commits[1], {
    via: 'commit-batch',
    expected: 'T1',
    next: 'I',
    mode: 'start-after',
    decisions: [{ tag: 'skip', val: 'invalidate' }],
  });
  assert.equal(host.calls.commits.length, 2);
  assert.deepEqual(host.calls.advanced, []);
  assert.deepEqual(report, { status: 'invalidated', eventsHandedOff: 1, lastEventId: await eventId('I') });
});

test('max events ends the run without saving the watermark', async () => {
  const host = fakeHost({ script: [delivered('T1'), delivered('T2'), delivered('T3')], watermark: 'W' });
  const report = await runWith(host, handAll, settings(2));
  assert.equal(host.calls.commits.length, 2);
  assert.deepEqual(host.calls.advanced, []);
  assert.equal(report.eventsHandedOff, 2);
});

test('a run reads past max events to finish a source transaction, and decide sees its place', async () => {
  const place = (index) => ({ id: 't1', index, size: 3 });
  const host = fakeHost({
    script: [delivered('T1'), delivered('T2'), delivered('T3'), delivered('T4')],
    transactions: { T1: place(0), T2: place(1), T3: place(2) },
    watermark: 'W',
  });
  const seen = [];
  const policy = { decide: (event) => (seen.push(event.sourceTransaction), handOff()) };
  const report = await runWith(host, policy, settings(2));
  // max events 2 ends inside t1: the run takes its third event, not the fourth.
  assert.equal(report.eventsHandedOff, 3);
  assert.deepEqual(seen, [place(0), place(1), place(2)]);
  assert.deepEqual(host.calls.advanced, []);
});

test('a run that follows the stream ends only when the host stops it', async () => {
  const script = [delivered('T1'), delivered('T2'), null, null, null, null, null, null];
  const host = fakeHost({ script: [...script, new Error('rejected: the run is stopping')], follow: true });
  await assert.rejects(runWith(host, handAll, settings(1, 1000n)), /stopping/);
  // Past max events 1 and six idle waits of the 1 s bound: only the host's refusal ended it.
  assert.equal(host.calls.commits.length, 2);
});

test('no token and no watermark is an error, never a gap', async () => {
  const host = fakeHost({});
  await assert.rejects(runWith(host), /did not provide an idle resume token; refusing to leave an uncheckpointed gap/);
});

test('the wait restarts after each event and stops the run when nothing comes', async () => {
  // 3 s of nothing between events is within a 5 s wait; 5 s of nothing at the end ends the run.
  const host = fakeHost({
    script: [null, null, null, delivered('T1'), null, null, null, delivered('T2')],
    watermark: 'T2',
  });
  const report = await runWith(host);
  assert.equal(report.eventsHandedOff, 2);
  const late = fakeHost({ script: [null, null, null, null, null, delivered('T1')], watermark: 'W' });
  assert.equal((await runWith(late)).eventsHandedOff, 0);
});

test('skips, quarantines and custom IDs reach the commit; only hand-offs count', async () => {
  const host = fakeHost({
    script: [delivered('A', 'insert', { 'fullDocument.kind': '"test"' }), delivered('B'), delivered('C', 'delete')],
    watermark: 'C',
  });
  const policy = {
    decide(event) {
      if (event.field('fullDocument.kind') === '"test"') return skip('test document');
      if (event.operationType === 'delete') return quarantine(`q-${event.id.slice(0, 8)}`, 'no deletes');
      return handOff('custom-id');
    },
  };
  const report = await runWith(host, policy);
  assert.deepEqual(
    host.calls.commits.map((c) => c.decisions[0]),
    [
      { tag: 'skip', val: 'test document' },
      { tag: 'hand-off', val: 'custom-id' },
      { tag: 'quarantine', val: { id: `q-${(await eventId('C')).slice(0, 8)}`, reason: 'no deletes' } },
    ],
  );
  assert.deepEqual(report, { status: 'handed-off', eventsHandedOff: 1, lastEventId: 'custom-id' });
});

test('a shaped record goes through commit-records', async () => {
  const host = fakeHost({ script: [delivered('A', 'insert', { 'documentKey._id': '"o-1"' })], watermark: 'A' });
  const policy = {
    decide: (event) =>
      record({ eventType: 'OrderCreated', aggregateId: event.field('documentKey._id'), payload: { total: 5 } }),
  };
  const report = await runWith(host, policy);
  assert.deepEqual(host.calls.commits[0].via, 'commit-records');
  assert.deepEqual(host.calls.commits[0].decisions, [
    {
      tag: 'hand-off-record',
      val: {
        id: await eventId('A'),
        eventType: 'OrderCreated',
        schemaVersion: 1,
        aggregateId: '"o-1"',
        aggregateVersion: undefined,
        payload: '{"total":5}',
      },
    },
  ]);
  assert.equal(report.eventsHandedOff, 1);
});

test('the event carries its identity and reads fields through the host', async () => {
  const host = fakeHost({ script: [delivered('A', 'update', { 'fullDocument.n': '7' })], watermark: 'A' });
  let seen;
  await runWith(host, { decide: (event) => ((seen = event), handOff()) });
  assert.equal(seen.token, 'A');
  assert.equal(seen.operationType, 'update');
  assert.equal(seen.namespace, 'shop.orders');
  assert.deepEqual(seen.clusterTime, { seconds: 1700000000, increment: 1 });
  assert.equal(seen.id, await eventId('A'));
  assert.equal(seen.field('fullDocument.n'), '7');
  assert.equal(seen.field('fullDocument.missing'), undefined);
});

test('init reads parameters, its result reaches decide, and a throw refuses the run', async () => {
  const policy = {
    init(s) {
      const prefix = s.param('prefix', 'p');
      if (!/^[a-z]+$/.test(prefix)) throw new Error(`prefix must be lowercase letters, not ${prefix}`);
      return { prefix, maxEvents: s.maxEvents, maxWaitMs: s.maxWaitMs };
    },
    decide: (event, context) => handOff(`${context.prefix}-${event.id.slice(0, 6)}`),
  };
  const host = fakeHost({ script: [delivered('A')], watermark: 'A' });
  const report = await runWith(host, policy, settings(10, 2000n, [['prefix', 'shop']]));
  assert.equal(report.lastEventId, `shop-${(await eventId('A')).slice(0, 6)}`);
  const refused = fakeHost({ script: [delivered('A')] });
  await assert.rejects(runWith(refused, policy, settings(10, 2000n, [['prefix', 'X1']])), /prefix must be lowercase/);
  assert.deepEqual(refused.calls.opened, [], 'a refused run opens no stream');
});

test('a bad decision or ID fails the run before anything is committed', async () => {
  for (const decide of [() => undefined, () => 'id', () => handOff('bad id!'), () => quarantine('', 'r')]) {
    const host = fakeHost({ script: [delivered('A')], watermark: 'A' });
    await assert.rejects(runWith(host, { decide }));
    assert.deepEqual(host.calls.commits, []);
  }
});

test('host errors become the run error with the host message', async () => {
  const host = fakeHost({ script: [delivered('A'), hostError('history-lost', 'history is gone')] });
  const policy = exportPolicy(host, handAll);
  await assert.rejects(policy.run(settings()), (error) => error === 'history is gone');
  assert.equal(host.calls.commits.length, 1, 'what came before stays committed');
  assert.equal(message(hostError('conflict', 'moved')), 'moved');
  assert.equal(message(new Error('plain')), 'plain');
  assert.equal(message('text'), 'text');
});

test('async decisions are awaited', async () => {
  const host = fakeHost({ script: [delivered('A')], watermark: 'A' });
  const report = await runWith(host, { decide: async (event) => handOff(`x-${await eventId(event.token + '!')}`.slice(0, 40)) });
  assert.equal(report.eventsHandedOff, 1);
});

test('logs, deployment identity and checkpoint reach the host', async () => {
  const host = fakeHost({ checkpoint: { token: 'T0', mode: 'start-after' } });
  bindHost(host);
  log.info('hello', { events: 3 });
  log.error('bad');
  assert.deepEqual(host.calls.logs, [
    ['info', 'hello', [['events', '3']]],
    ['error', 'bad', []],
  ]);
  assert.deepEqual(deployment(), { consumer: 'c1', source: 'shop.orders', replicaSetId: '65f0a1b2c3d4e5f601234567' });
  assert.deepEqual(checkpoint(), { token: 'T0', mode: 'start-after' });
});

// A snapshot run's host delivering documents `keys`: `deleted` ones are corrections of documents
// the source no longer holds.
function snapshotHost(kind, keys, deleted = []) {
  const script = keys.map((key, i) => {
    const document = deleted.includes(key) ? 'null' : JSON.stringify({ _id: key, status: 'paid' });
    return snapshotDocument(`S${i + 1}`, JSON.stringify(key), document);
  });
  return fakeHost({ script, kind });
}

test('a snapshot run commits each document with what decide says, in delivery order', async () => {
  const host = snapshotHost('backfill', ['o-1', 'o-2', 'o-3', 'o-4']);
  const policy = {
    decide(event) {
      const key = JSON.parse(event.field('documentKey._id'));
      if (key === 'o-2') return skip('not published');
      if (key === 'o-3') return quarantine(`q-${key}`, 'poison');
      if (key === 'o-4') {
        const aggregateId = event.field('documentKey._id');
        return record({ eventType: 'OrderPaid', aggregateId, payload: event.field('fullDocument') });
      }
      return handOff();
    },
  };
  const report = await runWith(host, policy, settings(4));
  assert.deepEqual(host.calls.opened, [{ tag: 'now' }]);
  assert.deepEqual(
    host.calls.commits.map(({ via, expected, next, decisions }) => [via, expected, next, decisions]),
    [
      ['commit-batch', undefined, 'S1', [{ tag: 'hand-off', val: await eventId('S1') }]],
      ['commit-batch', 'S1', 'S2', [{ tag: 'skip', val: 'not published' }]],
      ['commit-batch', 'S2', 'S3', [{ tag: 'quarantine', val: { id: 'q-o-3', reason: 'poison' } }]],
      [
        'commit-records',
        'S3',
        'S4',
        [
          {
            tag: 'hand-off-record',
            val: {
              id: await eventId('S4'),
              eventType: 'OrderPaid',
              schemaVersion: 1,
              aggregateId: '"o-4"',
              aggregateVersion: undefined,
              payload: '{"_id":"o-4","status":"paid"}',
            },
          },
        ],
      ],
    ],
  );
  assert.deepEqual(host.calls.advanced, []);
  assert.deepEqual(report, { status: 'handed-off', eventsHandedOff: 2, lastEventId: await eventId('S4') });
});

test('decide sees snapshot events with their baseline IDs, and the run kind', async () => {
  const seen = [];
  const policy = {
    decide: (event) => (seen.push([event.operationType, event.id, runKind()]), handOff()),
  };
  await runWith(snapshotHost('repair', ['o-1', 'o-2']), policy, settings(2));
  assert.deepEqual(seen, [
    ['snapshot', await eventId('S1'), 'repair'],
    ['snapshot', await eventId('S2'), 'repair'],
  ]);
  await runWith(fakeHost({ script: [delivered('T1')], watermark: 'T1' }), policy);
  assert.equal(seen.at(-1)[2], 'changes');
});

test('a deleted document reaches decide with a null fullDocument', async () => {
  const host = snapshotHost('repair', ['o-1', 'o-2'], ['o-2']);
  const policy = {
    decide: (event) =>
      JSON.parse(event.field('fullDocument')) === null
        ? record({ eventType: 'OrderDeleted', aggregateId: event.field('documentKey._id'), payload: {} })
        : handOff(),
  };
  await runWith(host, policy, settings(2));
  assert.deepEqual(
    host.calls.commits.map((c) => [c.decisions[0].tag, c.decisions[0].val.eventType]),
    [
      ['hand-off', undefined],
      ['hand-off-record', 'OrderDeleted'],
    ],
  );
});

test('a snapshot run past its documents ends without a watermark', async () => {
  const host = snapshotHost('backfill', ['o-1']);
  const report = await runWith(host, handAll, settings(2));
  assert.equal(host.calls.commits.length, 1);
  assert.deepEqual(host.calls.advanced, []);
  assert.equal(report.eventsHandedOff, 1);
});

test('a throw in decide or init fails a snapshot run with its message', async () => {
  const policy = {
    decide(event) {
      if (event.field('documentKey._id') === '"o-2"') throw new Error('no sku');
      return handOff();
    },
  };
  const host = snapshotHost('backfill', ['o-1', 'o-2']);
  await assert.rejects(exportPolicy(host, policy).run(settings(2)), (error) => error === 'no sku');
  const refusing = {
    init() {
      throw new Error('no prefix');
    },
    decide: policy.decide,
  };
  const refused = snapshotHost('backfill', ['o-1']);
  await assert.rejects(exportPolicy(refused, refusing).run(settings(1)), (error) => error === 'no prefix');
  assert.deepEqual(refused.calls.opened, []);
});

// Contract 1.6: the decisions module's optional `effect` and `classify`.
const RECORD_JSON =
  '{"_id": "c/abc", "event": {"operationType": "delete", "documentKey": {"_id": {"$oid": "6740a1b2c3d4e5f601234567"}}}}';

test('a delivery record reads by dotted path', () => {
  const r = new DeliveryRecord('hooks', 'webhook', RECORD_JSON);
  assert.equal(r.id, 'c/abc');
  assert.equal(r.field('event.operationType'), 'delete');
  assert.deepEqual(r.field('event.documentKey._id'), { $oid: '6740a1b2c3d4e5f601234567' });
  assert.equal(r.field('event.fullDocument.total'), undefined);
  assert.equal(r.field('_id.length'), undefined);
});

test('a module without effect or classify gets the host default', () => {
  assert.deepEqual(effectOf(handAll, new DeliveryRecord('d', 'webhook', RECORD_JSON)), { tag: 'default-effect' });
  assert.equal(classifyFailure(handAll, { httpStatus: 500 }), undefined);
});

test('requests reach the contract as it takes them, and refusals with their reason', () => {
  const policy = {
    effect(r) {
      if (r.sink === 'projection') return undefined;
      if (r.field('event.operationType') === 'delete') {
        return request({
          operation: 'post',
          key: r.field('event.documentKey._id'),
          version: 7,
          body: { deleted: true, id: r.id },
          headers: { 'x-kind': 'removal' },
        });
      }
      return refuse('not shaped');
    },
  };
  const exported = exportDelivery(policy);
  assert.deepEqual(exported.effectOf({ delivery: 'd', sink: 'projection', json: RECORD_JSON }), { tag: 'default-effect' });
  assert.deepEqual(exported.effectOf({ delivery: 'd', sink: 'webhook', json: RECORD_JSON }), {
    tag: 'request',
    val: {
      operation: 'post',
      key: '{"$oid":"6740a1b2c3d4e5f601234567"}',
      version: 7n,
      body: '{"deleted":true,"id":"c/abc"}',
      headers: [['x-kind', 'removal']],
    },
  });
  const other = RECORD_JSON.replace('delete', 'insert');
  assert.deepEqual(exported.effectOf({ delivery: 'd', sink: 'webhook', json: other }), { tag: 'refuse', val: 'not shaped' });
  assert.equal(request({ operation: 'upsert', key: 'o-1' }).key, '"o-1"');
  assert.equal(request({ operation: 'upsert', version: 18446744073709551615n }).version, 18446744073709551615n);
});

test('a wrong request or answer throws at once', () => {
  for (const bad of [
    { operation: 'shout' },
    { operation: 'post', version: -1 },
    { operation: 'post', version: 1.5 },
    { operation: 'post', version: 1n << 64n },
    { operation: 'post', body: [1, 2] },
    { operation: 'post', headers: [['a', 1]] },
    { operation: 'post', headers: [['a']] },
  ]) {
    assert.throws(() => request(bad), TypeError, JSON.stringify(bad, (k, v) => (typeof v === 'bigint' ? String(v) : v)));
  }
  const r = new DeliveryRecord('d', 'webhook', RECORD_JSON);
  assert.throws(() => effectOf({ effect: () => 'post' }, r), TypeError);
  assert.throws(() => classifyFailure({ classify: () => 'later' }, {}), TypeError);
});

test('classify answers a verdict or undefined', () => {
  const exported = exportDelivery({
    classify: (f) => (f.httpStatus === 409 ? 'ignore' : f.attempt >= 3 ? 'dead' : undefined),
  });
  assert.equal(exported.classify({ httpStatus: 409, attempt: 1 }), 'ignore');
  assert.equal(exported.classify({ httpStatus: 500, attempt: 3 }), 'dead');
  assert.equal(exported.classify({ httpStatus: 500, attempt: 1 }), undefined);
});
