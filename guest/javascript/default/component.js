// The component's entry: binds the contract's imports to the SDK and exports the policy.
import * as host from 'handoff:policy/host@1.6.0';
import * as decisions from './policy.js';
import { exportDelivery, exportPolicy } from '../sdk/handoff.js';

export const policy = exportPolicy(host, decisions);
export const delivery = exportDelivery(decisions);
