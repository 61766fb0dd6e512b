//! What an open cursor holds between batches.

use std::collections::VecDeque;

use bson::{Document, Timestamp};

use crate::namespace::Namespace;
use crate::oplog::TokenKey;
use crate::stages::Pipeline;

/// A find or aggregate cursor's remaining documents.
#[derive(Debug)]
pub struct FindCursor {
    pub ns: String,
    pub docs: VecDeque<Document>,
    /// The cluster time of the snapshot a `readConcern: {level: "snapshot"}` read saw; every
    /// batch reports it.
    pub at_cluster_time: Option<Timestamp>,
}

/// An open cursor of either kind.
#[derive(Debug)]
pub enum Cursor {
    Find(FindCursor),
    Change(Box<ChangeCursor>),
}

/// What a change stream watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Collection(Namespace),
    Database(String),
    Cluster,
}

/// What `fullDocument` asks for on update events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FullDocument {
    Default,
    /// The document as it is when the event is read.
    UpdateLookup,
    /// The stored post-image, or null.
    WhenAvailable,
    /// The stored post-image, or the stream fails.
    Required,
}

/// What `fullDocumentBeforeChange` asks for on update, replace and delete events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeforeChange {
    Off,
    WhenAvailable,
    Required,
}

/// How a change stream renders its events.
#[derive(Debug, Clone, Copy)]
pub struct EventOptions {
    pub full_document: FullDocument,
    pub before_change: BeforeChange,
    /// `showExpandedEvents`: DDL events, `collectionUUID`, `operationDescription`.
    pub expanded: bool,
    /// Whether `updateDescription.disambiguatedPaths` exists (MongoDB 6.1 and later).
    pub disambiguated_paths: bool,
}

/// A change stream's scope, position and stages.
#[derive(Debug)]
pub struct ChangeCursor {
    pub scope: Scope,
    /// Everything at or before this position has been delivered or skipped.
    pub after: TokenKey,
    pub options: EventOptions,
    /// Stages after `$changeStream`, applied to each event in order.
    pub pipeline: Pipeline,
    pub ns: String,
}
