// The default policy on the SDK against a fake host: every event handed off under its baseline ID.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import * as policy from './policy.js';
import { bindHost, eventId, run } from '../sdk/handoff.js';
import { delivered, fakeHost, settings, snapshotDocument } from '../sdk/fake-host.js';

test('every operation is handed off under the SHA-256 of its token text', async () => {
  const tokens = ['{"_data": "826AE70DA0000000012B0429296E1404"}', '{"_data": "826AE70DA0000000022B0429296E1404"}'];
  const host = fakeHost({
    script: [delivered(tokens[0], 'insert'), delivered(tokens[1], 'delete')],
    watermark: tokens[1],
  });
  bindHost(host);
  const report = await run(policy, settings());
  const ids = [await eventId(tokens[0]), await eventId(tokens[1])];
  assert.deepEqual(
    host.calls.commits.map((c) => c.decisions),
    ids.map((id) => [{ tag: 'hand-off', val: id }]),
  );
  assert.deepEqual(report, { status: 'handed-off', eventsHandedOff: 2, lastEventId: ids[1] });
});

test('an invalidation ends the run as the baseline does', async () => {
  const host = fakeHost({ script: [delivered('A'), delivered('I', 'invalidate')], watermark: 'W' });
  bindHost(host);
  const report = await run(policy, settings());
  assert.deepEqual(report, { status: 'invalidated', eventsHandedOff: 1, lastEventId: await eventId('I') });
  assert.equal(host.calls.commits[1].mode, 'start-after');
});

test('a snapshot run hands every document off under its baseline ID, a deleted one too', async () => {
  const host = fakeHost({
    kind: 'backfill',
    script: [snapshotDocument('S1', '"o-1"', '{"_id": "o-1"}'), snapshotDocument('S2', '"o-2"', 'null')],
  });
  bindHost(host);
  const report = await run(policy, settings(2));
  const ids = [await eventId('S1'), await eventId('S2')];
  assert.deepEqual(
    host.calls.commits.map((c) => c.decisions),
    ids.map((id) => [{ tag: 'hand-off', val: id }]),
  );
  assert.deepEqual(report, { status: 'handed-off', eventsHandedOff: 2, lastEventId: ids[1] });
});
