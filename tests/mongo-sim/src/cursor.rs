//! What an open cursor holds between batches.

use std::collections::VecDeque;

use bson::Document;

use crate::namespace::Namespace;
use crate::oplog::TokenKey;

/// A find or aggregate cursor's remaining documents.
#[derive(Debug)]
pub struct FindCursor {
    pub ns: String,
    pub docs: VecDeque<Document>,
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

/// A pipeline stage after `$changeStream`.
#[derive(Debug, Clone)]
pub enum Stage {
    Match(Document),
    Project(Document),
}

/// A change stream's scope, position and stages.
#[derive(Debug)]
pub struct ChangeCursor {
    pub scope: Scope,
    /// Everything at or before this position has been delivered or skipped.
    pub after: TokenKey,
    pub lookup: bool,
    /// Stages after `$changeStream`, applied to each event in order.
    pub stages: Vec<Stage>,
    pub ns: String,
}
