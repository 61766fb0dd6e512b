//! Admission: every record of the consumer's outbox gets one ledger entry, in hand-off order.
//!
//! The outbox's own change stream gives its records in commit order; the delivery's position is
//! that stream's resume token, moved in the same transaction as the entries it admits. A
//! delivery with no position yet (a new one), or whose position fell off the oplog, first
//! sweeps the whole outbox: the stream's current position is read, then every record is
//! admitted (in stream order of their events), then the position is set to what was read.
//! Admission only inserts entries that are missing, so a record admitted twice (by the sweep and
//! the stream, or by two deliverers) has one entry and is delivered once.

use std::time::{Duration, Instant};

use bson::{Bson, Document};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::ledger::{Admit, lane_of};

use crate::delivery::{self, Admission, Names, OutboxStream, PositionMoved};
use crate::transaction::Failure;
use crate::{Connection, OperationError};

/// Records admitted per transaction.
pub const ADMIT_BATCH: usize = 500;
/// How long a poll gathers records once the first has come.
const GATHER: Duration = Duration::from_millis(2);
/// Outbox records read per page of a sweep.
const SWEEP_PAGE: i64 = 1000;
/// How often a caught-up stream's newer position is saved although it brought no record (a
/// quiet outbox's position stays within the oplog).
const IDLE_SAVE: Duration = Duration::from_secs(10);
/// MongoDB's codes for a position the stream can no longer resume from.
const LOST_POSITION: [i32; 3] = [286, 280, 260];

/// The admitting side of a delivery.
pub struct Admitter<'a> {
    connection: &'a Connection,
    names: &'a Names,
    max_await: Duration,
    /// The position as stored (what the next admission expects).
    token: Option<Document>,
    stream: Option<OutboxStream<'a>>,
    saved_at: Instant,
    /// Records admitted by this deliverer.
    pub admitted: u64,
    /// Sweeps made (a new delivery, or a lost position).
    pub sweeps: u32,
}

/// An operation's failure as a delivery reports it.
pub fn unavailable(error: OperationError) -> HandoffError {
    let text = format!("{}: {}", error.what, error.message);
    match error.code {
        Some(13) => HandoffError::unauthorized(&text),
        Some(18) => HandoffError::Authentication(text),
        _ => HandoffError::Unavailable(text),
    }
}

impl<'a> Admitter<'a> {
    /// Opens the outbox stream at the stored position, sweeping the outbox first when there is
    /// none or it is lost.
    pub fn start(
        connection: &'a Connection,
        names: &'a Names,
        position: &Document,
        max_await: Duration,
    ) -> Result<Admitter<'a>> {
        let mut admitter = Admitter {
            connection,
            names,
            max_await,
            token: position.get_document("token").ok().cloned(),
            stream: None,
            saved_at: Instant::now(),
            admitted: 0,
            sweeps: 0,
        };
        admitter.open()?;
        Ok(admitter)
    }

    /// The stream opened at the stored position, or a sweep when it cannot be.
    fn open(&mut self) -> Result<()> {
        if let Some(token) = self.token.clone() {
            match self.connection.block_on(OutboxStream::open(
                self.connection,
                self.names,
                Some(&token),
                self.max_await,
            )) {
                Ok(stream) => {
                    self.stream = Some(stream);
                    return Ok(());
                }
                Err(error) if error.code.is_some_and(|c| LOST_POSITION.contains(&c)) => {
                    tracing::warn!(
                        code = error.code,
                        "the delivery's position is no longer in the outbox stream's history; \
                         sweeping the outbox (records delivered stay delivered)"
                    );
                }
                Err(error) => return Err(unavailable(error)),
            }
        }
        self.sweep()
    }

    /// Every outbox record admitted, then the stream from the position read before.
    fn sweep(&mut self) -> Result<()> {
        self.sweeps += 1;
        let connection = self.connection;
        let mut stream = connection
            .block_on(OutboxStream::open(
                connection,
                self.names,
                None,
                self.max_await,
            ))
            .map_err(unavailable)?;
        // One read makes the server give the stream's position; a record it gives is admitted
        // with the sweep (the rest stay in the stream).
        let early: Vec<Document> = connection
            .block_on(stream.next())
            .map_err(unavailable)?
            .into_iter()
            .collect();
        let from = stream.token();
        let mut records = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = connection
                .block_on(delivery::outbox_page(
                    connection,
                    self.names,
                    after.as_deref(),
                    SWEEP_PAGE,
                ))
                .map_err(unavailable)?;
            let Some(last) = page.last() else { break };
            after = last.get_str("_id").ok().map(str::to_string);
            let full = page.len() as i64 == SWEEP_PAGE;
            records.extend(page.into_iter().filter_map(|r| {
                let order = stream_order(&r);
                Some((order, r.get_str("_id").ok()?.to_string(), lane_of(&r)))
            }));
            if !full || after.is_none() {
                break;
            }
        }
        records.sort();
        records.extend(early.iter().filter_map(|r| {
            Some((
                stream_order(r),
                r.get_str("_id").ok()?.to_string(),
                lane_of(r),
            ))
        }));
        let admissions: Vec<Admission> = records
            .into_iter()
            .map(|(_, record, lane)| Admission { record, lane })
            .collect();
        tracing::info!(
            records = admissions.len(),
            "sweeping the outbox into the ledger"
        );
        let chunks: Vec<&[Admission]> = admissions.chunks(ADMIT_BATCH).collect();
        let last = chunks.len().saturating_sub(1);
        for (i, chunk) in chunks.iter().enumerate() {
            let token = if i == last { from.as_ref() } else { None };
            self.admit(chunk, token)?;
        }
        if chunks.is_empty() {
            self.admit(&[], from.as_ref())?;
        }
        self.stream = Some(stream);
        Ok(())
    }

    /// One admission transaction; the position moved under it (another deliverer) is read
    /// again and the stream reopened there.
    fn admit(&mut self, admissions: &[Admission], token: Option<&Document>) -> Result<()> {
        let result = self.connection.block_on(delivery::admit(
            self.connection,
            self.names,
            admissions,
            self.token.as_ref(),
            token,
        ));
        match result {
            Ok(admitted) => {
                self.admitted += admitted.new;
                if let Some(token) = token {
                    self.token = Some(token.clone());
                }
                self.saved_at = Instant::now();
                Ok(())
            }
            Err(Failure::Refused(PositionMoved)) => {
                let position = self
                    .connection
                    .block_on(delivery::position(self.connection, self.names))
                    .map_err(unavailable)?
                    .ok_or_else(|| {
                        HandoffError::Conflict(
                            "the delivery's position was removed while it ran".into(),
                        )
                    })?;
                tracing::info!("another deliverer moved the position; reading on from there");
                self.token = position.get_document("token").ok().cloned();
                self.stream = None;
                self.open()
            }
            Err(Failure::Failed(error) | Failure::Unknown(error)) => Err(unavailable(error)),
        }
    }

    /// Reads what the stream has (up to [`ADMIT_BATCH`] records: waiting at most the await
    /// bound for the first, then the rest of the server's batch, for at most [`GATHER`] more)
    /// and admits it. Returns how many records the stream gave.
    fn read(&mut self) -> Result<usize> {
        if self.stream.is_none() {
            self.open()?;
        }
        let connection = self.connection;
        let mut admissions = Vec::new();
        let Some(stream) = self.stream.as_mut() else {
            return Ok(0);
        };
        let mut first: Option<Instant> = None;
        loop {
            // What has come is admitted at once: a steady stream would otherwise keep the read
            // going until the batch is full.
            if first.is_some_and(|at| at.elapsed() >= GATHER) {
                break;
            }
            match connection.block_on(stream.next_of_batch()) {
                Ok(Some((record, more))) => {
                    first.get_or_insert_with(Instant::now);
                    if let Ok(id) = record.get_str("_id") {
                        admissions.push(Admission {
                            record: id.to_string(),
                            lane: lane_of(&record),
                        });
                    }
                    // The server's batch is over: reading on would wait for records that have
                    // not come yet, holding back those that have. What comes while these are
                    // admitted is the next batch (a group commit of its own).
                    if admissions.len() >= ADMIT_BATCH || !more {
                        break;
                    }
                }
                Ok(None) => break,
                Err(error) if error.code.is_some_and(|c| LOST_POSITION.contains(&c)) => {
                    self.stream = None;
                    self.token = None;
                    self.sweep()?;
                    return Ok(0);
                }
                Err(error) => {
                    self.stream = None;
                    return Err(unavailable(error));
                }
            }
        }
        let token = stream.token();
        let moved = token.is_some() && token != self.token;
        let n = admissions.len();
        if n > 0 || (moved && self.saved_at.elapsed() >= IDLE_SAVE) {
            self.admit(&admissions, token.as_ref())?;
        }
        Ok(n)
    }
}

impl Admit for Admitter<'_> {
    fn poll(&mut self) -> Result<usize> {
        self.read()
    }

    fn admitted(&self) -> u64 {
        self.admitted
    }

    fn sweeps(&self) -> u32 {
        self.sweeps
    }
}

/// A record's place in the stream: its event's (or its own) cluster time, then its token's
/// `_data` (records of the same transaction share the time).
fn stream_order(record: &Document) -> (u32, u32, String) {
    let event = record.get_document("event").ok();
    let time = event
        .and_then(|e| e.get_timestamp("clusterTime").ok())
        .or_else(|| record.get_timestamp("clusterTime").ok())
        .map_or((0, 0), |t| (t.time, t.increment));
    let data = event
        .and_then(|e| e.get_document("_id").ok())
        .or_else(|| record.get_document("token").ok())
        .and_then(|t| t.get("_data"))
        .and_then(Bson::as_str)
        .unwrap_or_default()
        .to_string();
    (time.0, time.1, data)
}
