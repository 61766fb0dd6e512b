//! Before the first chunk: the policy checked against the one the consumer's runs recorded, and
//! the consumer's checkpoint made to hold a token, so that every change made after the backfill
//! starts is handed off by the regular runs.

use bson::Bson;

use super::{Backfill, BackfillError};
use handoff_domain::StreamConfig;
use handoff_domain::checkpoint;
use handoff_domain::error::HandoffError;

impl Backfill<'_> {
    /// Refuses, before anything is written, a policy other than the one the consumer's last run
    /// recorded: the backfill's records would not be the ones its policy decides.
    pub(super) async fn check_policy(&self) -> Result<(), BackfillError> {
        let stored = self
            .store
            .checkpoint()
            .await
            .map_err(BackfillError::Server)?;
        let Some(stored) = stored else {
            return Ok(());
        };
        let loaded = checkpoint::validate(
            &stored,
            &self.options.source(),
            self.connection.deployment().pin(),
        )
        .map_err(BackfillError::Checkpoint)?;
        checkpoint::check_policy(&loaded, &self.snapshots.binding(), "backfill")
            .map_err(BackfillError::Checkpoint)
    }

    /// Makes the consumer's checkpoint hold a token: a missing one is created and a null token
    /// set to the source stream's current post-batch token (mode resumeAfter), as a fresh
    /// `handoff run` saves it. Returns whether it was set here.
    pub(super) async fn ensure_checkpoint(&self) -> Result<bool, BackfillError> {
        let o = &self.options;
        let source = o.source();
        let pin = self.connection.deployment().pin();
        let mut on_insert =
            checkpoint::initial_bound(&o.consumer, &source, pin, &StreamConfig::default());
        on_insert.remove("_id");
        let stored = self
            .store
            .upsert_checkpoint(on_insert)
            .await
            .map_err(BackfillError::Server)?
            .ok_or_else(|| {
                BackfillError::Unexpected("the checkpoint vanished after its upsert".into())
            })?;
        let loaded =
            checkpoint::validate(&stored, &source, pin).map_err(BackfillError::Checkpoint)?;
        if let Some(config) = &loaded.config
            && (config.partition.is_some()
                || !config.pipeline.is_empty()
                || config.scope != handoff_domain::config::Scope::Collection)
        {
            return Err(BackfillError::Checkpoint(HandoffError::BadInput(format!(
                "consumer {} does not stream whole documents of the whole collection (a partition, \
                 a pipeline or a wider scope): snapshot records of every document would not be \
                 what its runs hand off. Backfill a consumer of the plain collection stream",
                o.consumer
            ))));
        }
        if loaded.token.is_some() {
            return Ok(false);
        }
        let token = match self
            .store
            .source_token()
            .await
            .map_err(BackfillError::Server)?
        {
            None => {
                return Err(BackfillError::Unexpected(
                    "the source's change stream reported no post-batch resume token".into(),
                ));
            }
            Some(Bson::Document(token)) if checkpoint::is_resume_token(&token) => token,
            Some(_) => {
                return Err(BackfillError::Unexpected(
                    "the source's change stream reported a token of another shape".into(),
                ));
            }
        };
        if self
            .store
            .start_checkpoint(&source, token)
            .await
            .map_err(BackfillError::Server)?
        {
            tracing::info!(consumer = %o.consumer, "consumer checkpoint started at the stream's current position");
            return Ok(true);
        }
        // A run saved its own starting position meanwhile: that one is older still.
        let now = self
            .store
            .checkpoint()
            .await
            .map_err(BackfillError::Server)?;
        match now.map(|c| checkpoint::validate(&c, &source, pin)) {
            Some(Ok(c)) if c.token.is_some() => Ok(false),
            Some(Err(e)) => Err(BackfillError::Checkpoint(e)),
            _ => Err(BackfillError::Conflict),
        }
    }
}
