//! The change stream's shape: scope, pipeline, images, partition, split events, and how a run
//! binds its consumer's checkpoint.

use std::time::Duration;

use clap::Args;

use handoff::domain::StreamConfig;
use handoff::domain::config::{
    BeforeChange, FullDocument, MAX_PIPELINE_BYTES, Partition, Scope, check_keeps_namespace,
    parse_pipeline,
};
use handoff::error::{HandoffError, Result};
use handoff::run::StreamOptions;

use super::reason_text;
use crate::cli::env;

/// The change stream's shape and how a run binds its consumer's checkpoint.
#[derive(Args, Clone, Debug)]
pub struct StreamArgs {
    /// What the stream watches: collection (the baseline), database, or deployment. A database
    /// or deployment stream leaves out handoff's state collections, every consumer's, and its
    /// pipeline must keep each event's namespace (ns).
    #[arg(
        long,
        env = env::STREAM_SCOPE,
        default_value = "collection",
        value_name = "SCOPE"
    )]
    pub scope: String,
    /// Stages run on the change stream: a JSON file (or, starting with `[`, the JSON itself) holding
    /// an array of $match, $project, $addFields, $set, $unset, $replaceRoot, $replaceWith or
    /// $redact stages, in Extended JSON. A pipeline that changes `_id` or `operationType` is
    /// refused.
    #[arg(long, env = env::PIPELINE, value_name = "FILE.json")]
    pub pipeline: Option<String>,
    /// fullDocument: updateLookup (the baseline), default, whenAvailable or required (the last
    /// two read post-images: enable changeStreamPreAndPostImages on the collection).
    #[arg(
        long,
        env = env::FULL_DOCUMENT,
        default_value = "updateLookup",
        value_name = "MODE"
    )]
    pub full_document: String,
    /// fullDocumentBeforeChange: off, whenAvailable or required (pre-images: enable
    /// changeStreamPreAndPostImages on the collection).
    #[arg(
        long,
        env = env::FULL_DOCUMENT_BEFORE_CHANGE,
        default_value = "off",
        value_name = "MODE"
    )]
    pub full_document_before_change: String,
    /// This run's share of the source, `I/N` (0 <= I < N <= 1024): N runs with their own
    /// consumer IDs and I = 0..N-1 hand off every event exactly once between them, all events
    /// of one document key by the same run, in order. A consumer keeps its partition for good.
    #[arg(long, env = env::PARTITION, value_name = "I/N")]
    pub partition: Option<String>,
    /// Receive events over 16 MiB as fragments ($changeStreamSplitLargeEvent, MongoDB 7.0 and
    /// 6.0.9+): the fragments of one event reach the policy as one event and are committed
    /// together, one outbox record each.
    #[arg(
        long,
        env = env::SPLIT_LARGE_EVENTS,
        default_value = "false",
        value_name = "BOOL",
        value_parser = clap::value_parser!(bool),
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub split_large_events: bool,
    /// Continue a consumer whose checkpoint records another stream configuration; the change,
    /// with this reason, is recorded on the checkpoint. Another partition is never accepted.
    #[arg(long, env = env::ACCEPT_CONFIG_CHANGE, value_name = "REASON")]
    pub accept_config_change: Option<String>,
    /// How long the run's lease on its consumer lasts after each commit renews it, in seconds: a
    /// second run on the consumer stops at its start while the lease holds.
    #[arg(long, env = env::LEASE_SECONDS, default_value_t = 60, value_parser = clap::value_parser!(u64).range(5..=86_400))]
    pub lease_seconds: u64,
}

impl StreamArgs {
    /// The stream options, checked: nothing is read or written before they are.
    pub fn options(&self) -> Result<StreamOptions> {
        let bad = |what: &str, value: &str, allowed: &str| {
            HandoffError::BadInput(format!(
                "{what} {:?} is not one of {allowed}",
                handoff::domain::text::escape_untrusted(value, 40)
            ))
        };
        let scope = Scope::parse(&self.scope)
            .ok_or_else(|| bad("--scope", &self.scope, "collection, database, deployment"))?;
        let full_document = FullDocument::parse(&self.full_document).ok_or_else(|| {
            bad(
                "--full-document",
                &self.full_document,
                "updateLookup, default, whenAvailable, required",
            )
        })?;
        let before_change =
            BeforeChange::parse(&self.full_document_before_change).ok_or_else(|| {
                bad(
                    "--full-document-before-change",
                    &self.full_document_before_change,
                    "off, whenAvailable, required",
                )
            })?;
        let pipeline = match &self.pipeline {
            None => Vec::new(),
            Some(given) => {
                let text = if given.trim_start().starts_with('[') {
                    given.clone()
                } else {
                    read_pipeline(std::path::Path::new(given))?
                };
                parse_pipeline(&text)
                    .map_err(|why| HandoffError::BadInput(format!("--pipeline: {why}")))?
            }
        };
        if scope != Scope::Collection {
            check_keeps_namespace(&pipeline).map_err(|why| {
                HandoffError::BadInput(format!("--pipeline (--scope {}): {why}", scope.as_str()))
            })?;
        }
        let accept_config_change = match &self.accept_config_change {
            None => None,
            Some(reason) => Some(reason_text("--accept-config-change", reason)?),
        };
        let partition = match &self.partition {
            None => None,
            Some(text) => Partition::parse(text)
                .map_err(|why| HandoffError::BadInput(format!("--partition: {why}")))?,
        };
        Ok(StreamOptions {
            config: StreamConfig {
                scope,
                full_document,
                before_change,
                pipeline,
                partition,
                split_large_events: self.split_large_events,
            },
            accept_config_change,
            lease: Duration::from_secs(self.lease_seconds),
        })
    }
}

/// A pipeline file's text, read no further than the longest pipeline accepted.
fn read_pipeline(path: &std::path::Path) -> Result<String> {
    use std::io::Read;
    let unreadable = |e: std::io::Error| {
        HandoffError::BadInput(format!("--pipeline: cannot read {}: {e}", path.display()))
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut text = String::new();
    file.take(MAX_PIPELINE_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(unreadable)?;
    Ok(text)
}
