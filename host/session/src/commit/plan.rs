//! A commit's decisions turned into records, each checked (its ID, its shape, its size, the
//! event it names) before anything is written.

use std::collections::HashSet;

use bson::raw::cstr;
use bson::{RawBsonRef, RawDocumentBuf};
use sha2::{Digest, Sha256};

use super::{Decision, MAX_ID_LEN, MAX_REASON_CHARS, Planned, id_like};
use crate::refusal::Refusal;
use crate::{Session, transaction};
use handoff_domain::Mode;
use handoff_domain::error::{EVENT_TOO_LARGE_GUIDANCE, HandoffError};
use handoff_domain::text::escape_untrusted;

impl Session {
    /// The records of each decision, checked: nothing is written unless every one is valid.
    /// The decisions are those of the pending events from `offset` on (those before it are
    /// held); `ids` holds the record IDs already in the transaction, and gains these.
    pub(super) fn plan(
        &mut self,
        decisions: &[Decision],
        mode: Mode,
        offset: usize,
        ids: &mut HashSet<(bool, String)>,
    ) -> Result<Vec<Planned>, Refusal> {
        let count = decisions.len();
        let mut plan = Vec::with_capacity(count);
        for (index, decision) in decisions.iter().enumerate() {
            let delivered = &self.pending[offset + index];
            let invalidate = delivered.invalidate;
            if invalidate {
                if index != count - 1 || mode != Mode::StartAfter {
                    return Err(self.reject("an invalidate token must be saved with startAfter"));
                }
                if !matches!(decision, Decision::Skip(_)) {
                    return Err(
                        self.reject("an invalidate event is never handed off or quarantined")
                    );
                }
            }
            let Some(checkpoint_token) = delivered.checkpoint_token() else {
                return Err(self.reject("the event has no token"));
            };
            let mut step = Planned {
                token: checkpoint_token,
                text: delivered.text.clone(),
                invalidate,
                boundary: transaction::boundary(delivered.txn.as_ref()),
                ends_transaction: delivered
                    .txn
                    .as_ref()
                    .is_some_and(|p| p.size.is_some() && p.boundary()),
                txn_id: delivered.txn.as_ref().map(|p| p.id.clone()),
                opens_oversized: delivered
                    .txn
                    .as_ref()
                    .is_some_and(|p| p.size.is_none() && p.index == 0),
                ..Planned::default()
            };
            if invalidate && self.outbox_options.invalidate_marker {
                // Its ID is the one the baseline reports for an invalidation: the SHA-256 of
                // its token's canonical text.
                let id = hex::encode(Sha256::digest(delivered.text.as_bytes()));
                let mut marker = self.record_head(&format!("{}/{id}", self.consumer.consumer));
                marker.append(cstr!("marker"), "invalidate");
                marker.append(cstr!("event"), delivered.event.as_ref());
                step.bytes = marker.as_bytes().len();
                step.outbox = vec![marker];
                step.marker = true;
            }
            if let Some(id) = decision.id() {
                if !id_like(id, MAX_ID_LEN) {
                    return Err(self.reject(format!(
                        "an outbox or quarantine ID must be 1-{MAX_ID_LEN} characters from [A-Za-z0-9._:-]"
                    )));
                }
                let key = format!("{}/{id}", self.consumer.consumer);
                let hand_off = !matches!(decision, Decision::Quarantine { .. });
                if !ids.insert((hand_off, key.clone())) {
                    return Err(self.reject(format!("the ID {id} appears twice in one commit")));
                }
                // A split event gets a record per fragment, `<id>.<k>of<n>`, so that each stays
                // under the document limit and a reader can put the event together again.
                let fragments: Vec<_> = delivered.fragments().collect();
                let count = fragments.len();
                let part = |k: usize| {
                    if count == 1 {
                        key.clone()
                    } else {
                        format!("{key}.{}of{count}", k + 1)
                    }
                };
                // A record per fragment: the raw event's bytes as the server sent them (a
                // quarantine record adds its token and reason, before the event as the
                // baseline's order has it).
                let per_fragment = |reason: Option<&str>| -> Vec<RawDocumentBuf> {
                    fragments
                        .iter()
                        .enumerate()
                        .map(|(k, fragment)| {
                            let mut record = self.record_head(&part(k));
                            if let Some(reason) = reason {
                                let token = fragment.get("_id").ok().flatten();
                                record.append(cstr!("token"), token.unwrap_or(RawBsonRef::Null));
                                record.append(cstr!("reason"), reason);
                            }
                            record.append(cstr!("event"), *fragment);
                            record
                        })
                        .collect()
                };
                let records: Vec<RawDocumentBuf> = match decision {
                    Decision::Quarantine { reason, .. } => {
                        let reason: String = reason.chars().take(MAX_REASON_CHARS).collect();
                        per_fragment(Some(&reason))
                    }
                    Decision::HandOffRecord(shaped) => {
                        // The raw event of a split event is too large to keep beside a payload.
                        let mut options = self.outbox_options;
                        options.keep_event &= count == 1;
                        let head = self.record_head(&key);
                        match shaped.record(head, &delivered.event, options) {
                            Ok(record) => vec![record],
                            Err(why) => {
                                return Err(self.reject(format!("the record {id}: {why}")));
                            }
                        }
                    }
                    _ => per_fragment(None),
                };
                for record in &records {
                    let bytes = record.as_bytes().len();
                    if bytes > self.bounds.max_record_bytes {
                        let shaped = matches!(decision, Decision::HandOffRecord(_));
                        return Err(self.record_too_large(id, bytes, shaped));
                    }
                    step.bytes += bytes;
                }
                if hand_off {
                    step.handed_off = Some(id.to_string());
                    step.outbox = records;
                } else {
                    step.quarantine = records;
                    step.quarantined = true;
                }
            }
            if let Decision::Skip(reason) = decision
                && !invalidate
            {
                step.skipped = true;
                tracing::info!(
                    reason = %escape_untrusted(reason, 200),
                    "event skipped by the policy"
                );
            }
            plan.push(step);
        }
        Ok(plan)
    }

    /// The fields every record of this consumer starts with: its `_id`, the consumer and the
    /// source.
    fn record_head(&self, id: &str) -> RawDocumentBuf {
        let mut record = RawDocumentBuf::new();
        record.append(cstr!("_id"), id);
        record.append(cstr!("consumer"), self.consumer.consumer.as_str());
        record.append(cstr!("source"), self.consumer.source.as_str());
        record
    }

    /// A record over MongoDB's document limit: nothing of the commit is written.
    /// A record the policy shaped is the policy's to make smaller.
    fn record_too_large(&mut self, id: &str, bytes: usize, shaped: bool) -> Refusal {
        let limit = self.bounds.max_record_bytes;
        if shaped {
            return self.fail(HandoffError::Policy(format!(
                "The record {id} shaped by the policy would be {bytes} bytes, over the {limit}-byte \
                 document limit (its payload plus the kept change event). Shape a smaller payload, or \
                 run with --outbox-keep-event false to leave the raw event out of shaped records. \
                 Nothing of the commit was written."
            )));
        }
        self.fail(HandoffError::EventTooLarge(format!(
            "{EVENT_TOO_LARGE_GUIDANCE} The record {id} would be {bytes} bytes, over the {limit}-byte document limit."
        )))
    }
}
