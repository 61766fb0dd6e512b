// The default policy's decisions: every event is handed off under the baseline's event ID
// (lowercase hex SHA-256 of its token text). The SDK skips invalidations and owns the rest of the
// run: resume mode, one commit per event, the idle watermark and the report.

import { handOff } from '../sdk/handoff.js';

/** The decision for one delivered event. */
export function decide(event) {
  return handOff(event.id);
}
