//! One chunk between its watermarks: the low watermark written, the chunk read, the high
//! watermark written, then the stream read until the high watermark's event, every source event
//! between the two dropping its key's row; the remaining rows decided by the consumer's policy
//! at the high watermark's position.

use std::collections::HashSet;
use std::time::Instant;

use bson::oid::ObjectId;
use bson::{Bson, Document, doc};

use super::{Backfill, BackfillError};
use handoff_backend::snapshot::{Read, SnapshotPosition};
use handoff_domain::checkpoint;
use handoff_domain::token::cluster_time;
use handoff_mongo::backfill::Watermark;
use handoff_mongo::events::Events;
use handoff_run::snapshot::Decided;

/// What one chunk came to.
pub(super) enum Chunk {
    /// No document after the last key: the backfill is done.
    Empty,
    Rows {
        /// What the policy made of the rows no stream event superseded.
        decided: Box<Decided>,
        last_key: Bson,
        /// Documents read.
        read: usize,
        /// Rows dropped for a stream event between the watermarks.
        dropped: usize,
    },
}

/// A document key as a comparable value (its BSON encoding).
fn key_bytes(key: &Bson) -> Vec<u8> {
    bson::serialize_to_vec(&doc! { "k": key.clone() }).unwrap_or_default()
}

impl Backfill<'_> {
    /// One chunk between its watermarks.
    pub(super) async fn chunk(
        &self,
        stream: &mut Events<'_>,
        chunk: i64,
        last_key: &Option<Bson>,
    ) -> Result<Chunk, BackfillError> {
        let o = &self.options;
        let low = ObjectId::new();
        self.store
            .write_watermark(Watermark::Low, low, chunk)
            .await
            .map_err(BackfillError::Server)?;
        let rows = self.read_rows(last_key).await?;
        let Some(last) = rows.last().and_then(|r| r.get("_id")).cloned() else {
            self.store.remove_watermarks(&[low]).await;
            return Ok(Chunk::Empty);
        };
        let high = ObjectId::new();
        self.store
            .write_watermark(Watermark::High, high, chunk)
            .await
            .map_err(BackfillError::Server)?;
        // The watermarks' time counts from the high one's write: reading the chunk is not
        // waiting for the stream.
        let deadline = Instant::now() + o.watermark_timeout;
        let mut low_seen = false;
        let mut changed: HashSet<Vec<u8>> = HashSet::new();
        let position = loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let timeout = BackfillError::WatermarkTimeout {
                which: if low_seen { "high" } else { "low" },
                chunk,
                seconds: o.watermark_timeout.as_secs(),
            };
            if remaining.is_zero() {
                return Err(timeout);
            }
            let event =
                match tokio::time::timeout(remaining, stream.next("reading the change stream"))
                    .await
                {
                    Err(_) => return Err(timeout),
                    Ok(next) => next.map_err(BackfillError::Server)?,
                };
            let Some(event) = event else {
                if !stream.is_alive() {
                    return Err(BackfillError::SourceGone("dropped (the stream ended)"));
                }
                continue;
            };
            let coll = event
                .get_document("ns")
                .ok()
                .and_then(|ns| ns.get_str("coll").ok())
                .unwrap_or_default();
            let operation = event.get_str("operationType").unwrap_or_default();
            let key = event
                .get_document("documentKey")
                .ok()
                .and_then(|k| k.get("_id"));
            if coll == o.signal_collection {
                match key {
                    Some(Bson::ObjectId(id)) if *id == low => low_seen = true,
                    Some(Bson::ObjectId(id)) if *id == high => {
                        if !low_seen {
                            return Err(BackfillError::Unexpected(
                                "the high watermark came through the stream before the low one"
                                    .into(),
                            ));
                        }
                        break watermark_position(&event)?;
                    }
                    _ => {}
                }
            } else if coll == o.collection && low_seen {
                match operation {
                    "drop" => return Err(BackfillError::SourceGone("dropped")),
                    "rename" => return Err(BackfillError::SourceGone("renamed")),
                    _ => {}
                }
                if let Some(key) = key {
                    changed.insert(key_bytes(key));
                }
            }
        };
        let read = rows.len();
        let mut reads = Vec::with_capacity(read);
        let mut dropped = 0;
        for row in rows {
            let Some(key) = row.get("_id") else {
                continue;
            };
            if changed.contains(&key_bytes(key)) {
                dropped += 1;
                continue;
            }
            reads.extend(Read::of(row));
        }
        let decided = self
            .snapshots
            .decide(&reads, &position)
            .map_err(BackfillError::Policy)?;
        // The watermarks have served; the signal collection need not grow with the backfill.
        self.store.remove_watermarks(&[low, high]).await;
        Ok(Chunk::Rows {
            decided: Box::new(decided),
            last_key: last,
            read,
            dropped,
        })
    }

    /// The next chunk's documents, by `_id`, after `last_key`. `$gt` compares within one BSON
    /// type: when the keys of that type are exhausted, the next ones are those of the following
    /// types in MongoDB's order (an aggregation comparison, across types).
    async fn read_rows(&self, last_key: &Option<Bson>) -> Result<Vec<Document>, BackfillError> {
        let limit = self.options.chunk_size;
        let find = |filter: Document| async move {
            self.store
                .rows(filter, limit)
                .await
                .map_err(BackfillError::Server)
        };
        let Some(last) = last_key else {
            return find(doc! {}).await;
        };
        let rows = find(doc! { "_id": { "$gt": last.clone() } }).await?;
        if !rows.is_empty() {
            return Ok(rows);
        }
        find(doc! { "$expr": { "$gt": ["$_id", { "$literal": last.clone() }] } }).await
    }
}

/// The position of a high watermark's change event: its resume token and cluster time.
fn watermark_position(event: &Document) -> Result<SnapshotPosition, BackfillError> {
    let token = event
        .get_document("_id")
        .ok()
        .filter(|t| checkpoint::is_resume_token(t))
        .cloned()
        .ok_or_else(|| {
            BackfillError::Unexpected("the high watermark's event has no resume token".into())
        })?;
    let cluster_time = match event.get("clusterTime") {
        Some(Bson::Timestamp(ts)) => *ts,
        _ => cluster_time(&token).ok_or_else(|| {
            BackfillError::Unexpected("the high watermark's event has no cluster time".into())
        })?,
    };
    Ok(SnapshotPosition {
        token,
        cluster_time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_by_type_and_value() {
        assert_eq!(key_bytes(&Bson::Int32(1)), key_bytes(&Bson::Int32(1)));
        assert_ne!(key_bytes(&Bson::Int32(1)), key_bytes(&Bson::Int64(1)));
        assert_ne!(
            key_bytes(&Bson::Int32(1)),
            key_bytes(&Bson::String("1".into()))
        );
    }
}
