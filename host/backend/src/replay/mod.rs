//! Replays a recorded change stream with a real server's resume semantics.
//!
//! - no token: the stream starts at the first recorded line;
//! - `resumeAfter` / `startAfter` a token the recording holds (an event's `_id` or a post-batch
//!   token): the stream continues after it;
//! - `resumeAfter` an invalidate event's token: `InvalidResumeToken` (260); `startAfter` it works;
//! - a token the recording does not hold: `ChangeStreamHistoryLost` (286);
//! - an `$error` line fails the stream at that point, on every read;
//! - after an invalidate event the cursor is closed: the stream yields nothing more.
//!
//! The clock is virtual: it advances by the await bound whenever `next` finds nothing, so a
//! caught-up replay ends its idle wait at once while keeping the policy's timing logic intact.
//! The policy's WASI clocks follow it (a sleep moves it instead of waiting), its wall clock starts
//! at the first event's `clusterTime`, and its random sources are seeded from the recording (see
//! [`handoff_domain::time`]).

use std::sync::Arc;

use bson::Document;
use sha2::{Digest, Sha256};

pub use handoff_domain::fixture::{Entry, Fixture, RecordedDeployment};

use handoff_domain::time::{DEFAULT_WALL_EPOCH_SECS, VirtualClock, VirtualTime};
use handoff_domain::token::canonical_text;
use handoff_domain::{ChangeSource, Deployment, ServerError, Start, StreamError};

/// The await bound a live stream uses (`maxAwaitTimeMS`), applied to the virtual clock.
pub const AWAIT_MS: u64 = 1000;

/// The identity used for a recording that names no deployment.
pub const DEFAULT_SET_NAME: &str = "replay";
pub const DEFAULT_REPLICA_SET_ID: &str = "000000000000000000000000";

pub struct ReplaySource {
    fixture: Arc<Fixture>,
    position: usize,
    opened: bool,
    closed: bool,
    watermark: Option<Document>,
    clock: VirtualClock,
}

impl ReplaySource {
    pub fn new(fixture: Arc<Fixture>) -> Self {
        ReplaySource {
            fixture,
            position: 0,
            opened: false,
            closed: false,
            watermark: None,
            clock: VirtualClock::new(),
        }
    }

    fn history_lost() -> StreamError {
        StreamError::HistoryLost(ServerError {
            code: Some(286),
            code_name: "ChangeStreamHistoryLost".into(),
            message: "Resume of change stream was not possible, as the resume point may no longer be in the oplog."
                .into(),
        })
    }
}

impl ChangeSource for ReplaySource {
    fn deployment(&mut self) -> handoff_domain::error::Result<Deployment> {
        Ok(match &self.fixture.deployment {
            Some(d) => d.deployment.clone(),
            None => Deployment::replica_set(DEFAULT_SET_NAME, DEFAULT_REPLICA_SET_ID),
        })
    }

    fn open(&mut self, start: Start<Document>) -> Result<(), StreamError> {
        let (token, start_after) = match &start {
            Start::Now => {
                self.position = 0;
                self.opened = true;
                return Ok(());
            }
            Start::ResumeAfter(token) => (token, false),
            Start::StartAfter(token) => (token, true),
        };
        let wanted = canonical_text(token);
        let found = self.fixture.entries.iter().position(|entry| match entry {
            Entry::Event { token_text, .. } | Entry::PostBatch { token_text, .. } => {
                *token_text == wanted
            }
            Entry::Error(_) => false,
        });
        let Some(index) = found else {
            return Err(Self::history_lost());
        };
        if let Entry::Event { event, .. } = &self.fixture.entries[index]
            && event.get_str("operationType").ok() == Some("invalidate")
            && !start_after
        {
            return Err(StreamError::InvalidToken(ServerError {
                code: Some(260),
                code_name: "InvalidResumeToken".into(),
                message: "Attempting to resume a change stream using 'resumeAfter' is not allowed from an invalidate notification."
                    .into(),
            }));
        }
        self.position = index + 1;
        self.opened = true;
        Ok(())
    }

    fn next(&mut self) -> Result<Option<Document>, StreamError> {
        if !self.opened || self.closed {
            self.clock.advance_ms(AWAIT_MS);
            return Ok(None);
        }
        while let Some(entry) = self.fixture.entries.get(self.position) {
            match entry {
                Entry::PostBatch { token, .. } => {
                    self.watermark = Some(token.clone());
                    self.position += 1;
                }
                Entry::Error(error) => return Err(StreamError::from_server(error.clone())),
                Entry::Event { event, .. } => {
                    self.position += 1;
                    let token = match event.get_document("_id") {
                        Ok(token) => token.clone(),
                        Err(_) => return Err(Self::history_lost()),
                    };
                    // A batch exhausted by this event reports its post-batch token, as drivers do.
                    self.watermark = match self.fixture.entries.get(self.position) {
                        Some(Entry::PostBatch {
                            token: batch_end, ..
                        }) => {
                            self.position += 1;
                            Some(batch_end.clone())
                        }
                        _ => Some(token),
                    };
                    if event.get_str("operationType").ok() == Some("invalidate") {
                        self.closed = true;
                    }
                    return Ok(Some(event.clone()));
                }
            }
        }
        self.clock.advance_ms(AWAIT_MS);
        Ok(None)
    }

    fn watermark(&self) -> Option<Document> {
        self.watermark.clone()
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn virtual_time(&self) -> Option<VirtualTime> {
        let first_event_time = self.fixture.entries.iter().find_map(|entry| match entry {
            Entry::Event { event, .. } => event.get_timestamp("clusterTime").ok(),
            _ => None,
        });
        let mut digest = Sha256::new();
        if let Some(deployment) = &self.fixture.deployment {
            digest.update(deployment.deployment.id.as_bytes());
            digest.update(deployment.source.as_bytes());
        }
        for entry in &self.fixture.entries {
            match entry {
                Entry::Event { token_text, .. } => digest.update(format!("e{token_text}\n")),
                Entry::PostBatch { token_text, .. } => digest.update(format!("p{token_text}\n")),
                Entry::Error(error) => digest.update(format!("x{error:?}\n")),
            }
        }
        Some(VirtualTime {
            clock: self.clock.clone(),
            wall_epoch: std::time::Duration::from_secs(
                first_event_time.map_or(DEFAULT_WALL_EPOCH_SECS, |t| u64::from(t.time)),
            ),
            recording_digest: digest.finalize().into(),
        })
    }
}
