// The component's entry for a policy project: binds the contract's imports to the SDK and exports
// the project's decisions. It runs from the project's `node_modules/handoff-policy/`, so the
// decisions are `policy.js` at the project's root; the contract (its version here and
// `wit/policy.wit` beside this file) is this package's, so a project moves to a new contract by
// moving to a new version of the package. Build with
//   componentize-js --wit node_modules/handoff-policy/wit/policy.wit --world-name effects-policy \
//     --disable http fetch-event --out build/policy.wasm node_modules/handoff-policy/component.js
import * as host from 'handoff:policy/host@1.6.0';
import * as decisions from '../../policy.js';
import { exportDelivery, exportPolicy } from './handoff.js';

export const policy = exportPolicy(host, decisions);
export const delivery = exportDelivery(decisions);
