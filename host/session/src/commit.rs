//! The commit side of a session: a policy's decisions checked against what was delivered,
//! planned as records, and written with the checkpoint in one transaction per bounded chunk.

use bson::{Document, RawDocumentBuf};
use sha2::{Digest, Sha256};

use super::Session;

mod plan;
use super::record::{MAX_PAYLOAD_VALUES_PER_COMMIT, MAX_PAYLOADS_PER_COMMIT, Shaped, json_values};
use super::refusal::Refusal;
use handoff_domain::error::{EVENT_TOO_LARGE_GUIDANCE, HandoffError, RECONCILE_GUIDANCE};
use handoff_domain::token::canonical_text;
use handoff_domain::{Commit, CommitError, Mode};

/// The longest outbox ID a policy may choose.
pub const MAX_ID_LEN: usize = 200;
/// How many events one commit may cover.
pub const MAX_BATCH: usize = 500;
/// How many committed events stay readable through `field`.
const RECENT: usize = 16;
/// The longest quarantine reason kept, in characters.
const MAX_REASON_CHARS: usize = 1024;

/// What a commit does with one delivered event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// An outbox record with this event ID.
    HandOff(String),
    /// No record; the checkpoint moves past the event. The reason is logged.
    Skip(String),
    /// A quarantine record with this ID and reason.
    Quarantine { id: String, reason: String },
    /// An outbox record shaped by the policy (contract 1.2).
    HandOffRecord(Box<Shaped>),
}

impl Decision {
    /// The record ID the decision names, if it writes a record.
    fn id(&self) -> Option<&str> {
        match self {
            Decision::HandOff(id) | Decision::Quarantine { id, .. } => Some(id),
            Decision::HandOffRecord(shaped) => Some(&shaped.id),
            Decision::Skip(_) => None,
        }
    }
}

/// One delivered event as a commit will write it.
#[derive(Default)]
pub(crate) struct Planned {
    /// The token the checkpoint moves to (a split event's last fragment's).
    token: Document,
    text: String,
    /// Its outbox records: one, or one per fragment of a split event, encoded as written.
    outbox: Vec<RawDocumentBuf>,
    quarantine: Vec<RawDocumentBuf>,
    pub(crate) handed_off: Option<String>,
    skipped: bool,
    quarantined: bool,
    invalidate: bool,
    /// Its record is the invalidation's marker (`--invalidate-marker`).
    marker: bool,
    /// The size of its record.
    bytes: usize,
    /// A transaction may end after it: no source transaction wrote it, or it is the last of
    /// its source transaction (or of one over the bound).
    boundary: bool,
    /// It is the last event of a source transaction within the bound.
    ends_transaction: bool,
    /// Its source transaction's ID, when one wrote it.
    txn_id: Option<String>,
    /// It is the first event of a source transaction over the bound.
    opens_oversized: bool,
}

/// 1 to `max` bytes from `[A-Za-z0-9._:-]`: what an ID and a shaped record's `eventType` may
/// hold.
pub(super) fn id_like(text: &str, max: usize) -> bool {
    (1..=max).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

impl Session {
    /// The token the policy holds as its checkpoint: the last held event's while a commit is
    /// held, otherwise the checkpoint's.
    fn policy_token(&self) -> Option<&str> {
        match self.held.last() {
            Some(held) => Some(held.text.as_str()),
            None => self.token_text.as_deref(),
        }
    }

    fn check_expected(&mut self, expected: Option<&str>) -> Result<(), Refusal> {
        let holds = expected == self.policy_token()
            || (self.start_saved_for_policy && self.held.is_empty() && expected.is_none());
        if !holds {
            return Err(self.reject("`expected` is not the checkpoint token this run holds"));
        }
        Ok(())
    }

    /// Commits the next delivered event (contract 1.0): an outbox record for every event but an
    /// invalidation, which must have none.
    pub fn commit(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        outbox_id: Option<&str>,
    ) -> Result<(), Refusal> {
        self.gate()?;
        let invalidate = self
            .pending
            .get(self.held.len())
            .is_some_and(|d| d.invalidate && d.text == next);
        let decision = match outbox_id {
            Some(id) => Decision::HandOff(id.to_string()),
            None if invalidate => Decision::Skip("invalidate".into()),
            None => {
                return Err(self.reject(
                    "every event but an invalidation needs an outbox record (use commit-batch to skip)",
                ));
            }
        };
        self.commit_batch(expected, next, mode, vec![decision])
    }

    /// Commits the next delivered events, one decision each, in delivery order: in one
    /// transaction, or in consecutive ones when their records exceed the transaction bound.
    /// (Contracts 1.1 and 1.2: a 1.2 policy's hand-offs may carry shaped records.)
    pub fn commit_batch(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        decisions: Vec<Decision>,
    ) -> Result<(), Refusal> {
        self.gate()?;
        self.check_expected(expected)?;
        // Before coverage (a reader stops copying payloads past the text bound) and before any
        // payload is parsed (parsed values cost far more than their text).
        let (payloads, values) = decisions
            .iter()
            .filter_map(|d| match d {
                Decision::HandOffRecord(shaped) => Some(&shaped.payload),
                _ => None,
            })
            .fold((0usize, 0usize), |(bytes, values), payload| {
                (bytes + payload.len(), values + json_values(payload))
            });
        if payloads > MAX_PAYLOADS_PER_COMMIT {
            return Err(self.reject(format!(
                "the payloads of one commit exceed {} MiB",
                MAX_PAYLOADS_PER_COMMIT >> 20
            )));
        }
        if values > MAX_PAYLOAD_VALUES_PER_COMMIT {
            return Err(self.reject(format!(
                "the payloads of one commit hold more than {MAX_PAYLOAD_VALUES_PER_COMMIT} values"
            )));
        }
        self.check_coverage(next, decisions.len())?;
        let offset = self.held.len();
        let mut ids = std::mem::take(&mut self.held_ids);
        let planned = match self.plan(&decisions, mode, offset, &mut ids) {
            Ok(planned) => planned,
            Err(refusal) => {
                self.held_ids = ids;
                return Err(refusal);
            }
        };
        let mut plan = std::mem::take(&mut self.held);
        plan.extend(planned);
        if !plan.last().is_some_and(|step| step.boundary) {
            // The commit ends inside a source transaction: what comes before the transaction
            // is written now, the transaction's events are held until the commit that ends it,
            // so that all of the transaction is written at once or none of it.
            let cut = plan
                .iter()
                .rposition(|step| step.boundary)
                .map_or(0, |at| at + 1);
            if cut > 0 {
                let rest = plan.split_off(cut);
                self.write_planned(&mut plan, Mode::ResumeAfter)?;
                plan = rest;
            }
            let bytes: usize = plan.iter().map(|step| step.bytes).sum();
            if bytes <= self.bounds.max_transaction_bytes {
                tracing::debug!(
                    held = plan.len(),
                    "commit held until its source transaction ends"
                );
                self.held_from_start = self.committed.events == 0;
                self.held = plan;
                self.held_ids = ids;
                return Ok(());
            }
            // Its records already pass one transaction's bytes: written in parts now, so that
            // what the host holds stays bounded.
            self.split_transaction(&plan[0]);
            tracing::warn!(
                bytes_limit = self.bounds.max_transaction_bytes,
                "a source transaction's records exceed one transaction's bytes: handed off in \
                 order in several transactions"
            );
            return self.write_planned(&mut plan, Mode::ResumeAfter);
        }
        self.write_planned(&mut plan, mode)?;
        tracing::debug!(
            events = self.committed.events,
            batch = decisions.len(),
            "event committed"
        );
        Ok(())
    }

    /// Writes planned events in consecutive transactions of at most `max_transaction_bytes` of
    /// records each, cut where a source transaction ends when one can be; the last moves the
    /// checkpoint with `mode`.
    pub(crate) fn write_planned(
        &mut self,
        plan: &mut [Planned],
        mode: Mode,
    ) -> Result<(), Refusal> {
        let limit = self.bounds.max_transaction_bytes;
        let mut chunk_end = 0;
        while chunk_end < plan.len() {
            let chunk_start = chunk_end;
            let mut bytes = 0;
            while chunk_end < plan.len()
                && (chunk_end == chunk_start || bytes + plan[chunk_end].bytes <= limit)
            {
                bytes += plan[chunk_end].bytes;
                chunk_end += 1;
            }
            if chunk_end < plan.len() && !plan[chunk_end - 1].boundary {
                match plan[chunk_start..chunk_end - 1]
                    .iter()
                    .rposition(|step| step.boundary)
                {
                    Some(at) => chunk_end = chunk_start + at + 1,
                    None => {
                        if self.split_transaction(&plan[chunk_end - 1]) {
                            tracing::warn!(
                                bytes_limit = limit,
                                "a source transaction's records exceed one transaction's bytes: \
                                 handed off in order in several transactions"
                            );
                        }
                    }
                }
            }
            let last = chunk_end == plan.len();
            let chunk_mode = if last { mode } else { Mode::ResumeAfter };
            self.write(&mut plan[chunk_start..chunk_end], chunk_mode)?;
        }
        Ok(())
    }

    /// Counts the source transaction of `step` as handed off in several transactions, once;
    /// true the first time.
    pub(crate) fn split_transaction(&mut self, step: &Planned) -> bool {
        let Some(id) = &step.txn_id else {
            return false;
        };
        let first = self.split_transactions.insert(id.clone());
        if first {
            self.committed.transactions.split += 1;
        }
        first
    }

    /// A commit covers the first `count` delivered events, the last of which is `next`.
    fn check_coverage(&mut self, next: &str, count: usize) -> Result<(), Refusal> {
        if count == 0 {
            return Err(self.reject("a commit must cover at least one delivered event"));
        }
        if count > MAX_BATCH {
            return Err(self.reject(format!("a commit covers at most {MAX_BATCH} events")));
        }
        let held = self.held.len();
        let waiting = self.pending.len() - held;
        if count > waiting {
            return Err(self.reject(if waiting == 0 {
                "no delivered event is waiting for a commit".to_string()
            } else {
                format!("the commit covers {count} events but only {waiting} were delivered")
            }));
        }
        if self.pending[held + count - 1].text != next {
            let what = if self.pending.iter().any(|d| d.text == next) {
                "events must be committed in delivery order; this would skip a delivered event"
            } else {
                "the token was not delivered by the stream"
            };
            return Err(self.reject(what));
        }
        Ok(())
    }

    /// Writes the records of consecutive pending events and moves the checkpoint to the last
    /// of them, in one transaction; then takes them off the pending queue.
    fn write(&mut self, steps: &mut [Planned], mode: Mode) -> Result<(), Refusal> {
        let Some(last) = steps.last() else {
            return Ok(());
        };
        let next_token = last.token.clone();
        let next_text = last.text.clone();
        let outbox: Vec<RawDocumentBuf> = steps
            .iter_mut()
            .flat_map(|s| std::mem::take(&mut s.outbox))
            .collect();
        let quarantine: Vec<RawDocumentBuf> = steps
            .iter_mut()
            .flat_map(|s| std::mem::take(&mut s.quarantine))
            .collect();
        let step = Commit {
            consumer: &self.consumer,
            expected: self.token.as_ref(),
            next: &next_token,
            mode,
            outbox,
            quarantine,
            lease: self.lease.as_ref(),
            policy: self.policy.as_ref(),
        };
        let result = self.store.commit(&step);
        self.committed.transaction_retries = self.store.transaction_retries();
        if result.is_ok() {
            self.lease_renewed = std::time::Instant::now();
        }
        let applied = match result {
            Ok(applied) => applied,
            Err(error) => return Err(self.fail(match error {
                CommitError::Conflict => HandoffError::Conflict(
                    "Checkpoint changed during this run (another run moved it, or took over this run's lease); retry from the current token".into(),
                ),
                CommitError::Duplicate(id) => HandoffError::Conflict(format!(
                    "A record {id} already exists for another event (a different token, consumer or \
                     source): the policy's IDs collide, or another consumer writes under this \
                     consumer's IDs. Nothing was written"
                )),
                CommitError::Unavailable(detail) => HandoffError::Unavailable(format!(
                    "{RECONCILE_GUIDANCE} Store error: {detail}"
                )),
                CommitError::TooLarge(id) => HandoffError::EventTooLarge(format!(
                    "{EVENT_TOO_LARGE_GUIDANCE} The record {id} is over the limit."
                )),
                CommitError::Unauthorized(detail) => HandoffError::unauthorized(&detail),
            })),
        };
        for id in &applied.duplicates {
            tracing::info!(
                record = %id,
                "record already handed off for this event; not written again"
            );
        }
        let now = bson::DateTime::now().timestamp_millis();
        let mut latencies = Vec::new();
        for done in self.pending.drain(..steps.len()) {
            self.pending_bytes = self.pending_bytes.saturating_sub(done.bytes);
            // A change's write time is its `wallTime` (MongoDB 6.0 and later).
            if let (Some(histogram), Ok(written)) =
                (self.latencies.as_mut(), done.event.get_datetime("wallTime"))
            {
                let ms = now.saturating_sub(written.timestamp_millis()).max(1) as u64;
                histogram.saturating_record(ms.min(histogram.high()));
                if self.observer.is_some() {
                    latencies.push(ms);
                }
            }
            self.recent.push_back(done);
        }
        if let Some(histogram) = self.latencies.as_ref().filter(|h| !h.is_empty()) {
            self.committed.latency = Some(Box::new(super::Latency {
                count: histogram.len(),
                p50_ms: histogram.value_at_quantile(0.50),
                p99_ms: histogram.value_at_quantile(0.99),
                p999_ms: histogram.value_at_quantile(0.999),
                max_ms: histogram.max(),
            }));
        }
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
        self.token_text = Some(next_text);
        self.token = Some(next_token);
        self.mode = mode;
        self.start_saved_for_policy = false;
        for step in steps.iter().filter(|step| step.opens_oversized) {
            self.split_transaction(step);
        }
        let c = &mut self.committed;
        c.duplicates_suppressed += u32::try_from(applied.duplicates.len()).unwrap_or(u32::MAX);
        for step in steps.iter() {
            c.events += 1;
            if let Some(id) = &step.handed_off {
                c.handed_off += 1;
                c.last_event_id = id.clone();
                c.last_outbox_id = id.clone();
            }
            if step.skipped {
                c.skipped += 1;
            }
            if step.quarantined {
                c.quarantined += 1;
            }
            if step.marker {
                c.invalidate_markers += 1;
            }
            let split = step
                .txn_id
                .as_ref()
                .is_some_and(|id| self.split_transactions.contains(id));
            if step.ends_transaction && !split {
                c.transactions.whole += 1;
            }
            if step.invalidate {
                c.invalidated = true;
                // The baseline reports the invalidate event's own ID.
                c.last_event_id = hex::encode(Sha256::digest(step.text.as_bytes()));
            }
        }
        if let Some(observer) = &self.observer {
            observer.committed(&self.committed, &latencies, self.token.as_ref());
        }
        Ok(())
    }

    /// Saves the stream's idle watermark once every delivered event is committed.
    pub fn advance_watermark(&mut self, expected: Option<&str>, next: &str) -> Result<(), Refusal> {
        self.gate()?;
        self.check_expected(expected)?;
        if !self.pending.is_empty() {
            return Err(self.reject(
                "the watermark can only be saved once every delivered event is committed",
            ));
        }
        let Some(current) = self.watermark() else {
            return Err(self.reject("the stream has reported no watermark"));
        };
        if current != next {
            return Err(self.reject("the token is not the stream's current watermark"));
        }
        if self.committed.invalidated {
            return Err(self.reject("an invalidated stream has no watermark to save"));
        }
        // While events read ahead wait, the watermark is the last delivered event, which the
        // checkpoint holds once every delivered event is committed: the stream's own position
        // is past events the policy has not seen, so the checkpoint never moves there.
        if self.token_text.as_deref() == Some(next) || !self.ahead.is_empty() {
            return Ok(());
        }
        let Some(watermark) = self.source.watermark() else {
            return Err(self.reject("the stream has reported no watermark"));
        };
        self.move_checkpoint(
            watermark,
            "Checkpoint changed while saving the idle watermark",
            RECONCILE_GUIDANCE,
        )?;
        self.committed.watermark_saved = true;
        if let Some(observer) = &self.observer {
            observer.committed(&self.committed, &[], self.token.as_ref());
        }
        Ok(())
    }

    /// Moves the checkpoint from the token this run holds to `next` (resumeAfter), writing no
    /// record: the stream's starting position or its idle watermark.
    pub(super) fn move_checkpoint(
        &mut self,
        next: Document,
        on_conflict: &str,
        on_unavailable: &str,
    ) -> Result<(), Refusal> {
        let step = Commit {
            consumer: &self.consumer,
            expected: self.token.as_ref(),
            next: &next,
            mode: Mode::ResumeAfter,
            outbox: Vec::new(),
            quarantine: Vec::new(),
            lease: self.lease.as_ref(),
            policy: None,
        };
        let result = self.store.commit(&step);
        self.committed.transaction_retries = self.store.transaction_retries();
        if result.is_ok() {
            self.lease_renewed = std::time::Instant::now();
        }
        if let Err(error) = result {
            return Err(self.fail(match error {
                CommitError::Conflict | CommitError::Duplicate(_) => {
                    HandoffError::Conflict(on_conflict.into())
                }
                CommitError::Unavailable(detail) | CommitError::TooLarge(detail) => {
                    HandoffError::Unavailable(format!("{on_unavailable} Store error: {detail}"))
                }
                CommitError::Unauthorized(detail) => HandoffError::unauthorized(&detail),
            }));
        }
        self.token_text = Some(canonical_text(&next));
        self.token = Some(next);
        self.mode = Mode::ResumeAfter;
        Ok(())
    }
}
