//! The end of a run's lease and its record in the run history, in one `bulkWrite` where the
//! server has it (MongoDB 8.0 and later): giving the lease back costs the run one round trip,
//! history kept or not. Elsewhere the record is a second command.

use std::sync::atomic::Ordering;

use bson::{Document, doc};
use mongodb::error::{Error as DriverError, ErrorKind};
use mongodb::options::{ReplaceOneModel, UpdateOneModel, WriteModel};

use handoff_domain::CommitError;
use handoff_domain::history::RunRecord;
use handoff_domain::text::escape_untrusted;

use super::writes::no_bulk_write;
use super::{MongoStore, RELEASE_GRACE};

impl MongoStore {
    /// Ends `owner`'s lease at `at` if it still holds it, and keeps `record` in the run history
    /// (its slot replaced) when the store keeps one. Only the lease's end can fail the call: a
    /// record that cannot be written is logged.
    pub(super) fn end_lease(
        &self,
        consumer: &str,
        owner: &str,
        at: bson::DateTime,
        record: Option<&RunRecord>,
    ) -> std::result::Result<(), CommitError> {
        let (filter, update) = MongoStore::lease_end(consumer, owner, at);
        let kept = match (&self.runs, record) {
            (Some((runs, keep)), Some(record)) => {
                Some((runs, record.id(*keep), record.document(*keep)))
            }
            _ => None,
        };
        // A run stopped by its deadline still gives its lease back, if it can within a second
        // (a transaction its deadline interrupted may hold the checkpoint longer: then the lease
        // expires by itself).
        let ended = self
            .connection
            .bounded_past_deadline(
                async {
                    if let Some((runs, id, stored)) = &kept
                        && self.bulk_write.load(Ordering::Relaxed)
                    {
                        match self.end_in_one(&filter, &update, runs, id, stored).await {
                            Ok(()) => return Ok(()),
                            Err(e) if no_bulk_write(&e) => {
                                self.bulk_write.store(false, Ordering::Relaxed);
                            }
                            // Refused as a whole (a user without the runs collection's
                            // privileges is refused the command, not one of its writes): the
                            // lease's end is sent alone, then the record, whose failure is
                            // only a warning. Ending the lease again is harmless: its filter
                            // names the owner.
                            Err(e) => {
                                let error = self.connection.redact(&e.to_string());
                                tracing::debug!(
                                    error = %escape_untrusted(&error, 500),
                                    "the lease's end and the run's record were refused together; sent apart"
                                );
                            }
                        }
                    }
                    self.checkpoints
                        .update_one(filter.clone(), update.clone())
                        .await?;
                    if let Some((runs, id, stored)) = &kept
                        && let Err(e) = runs
                            .replace_one(doc! { "_id": id.clone() }, stored)
                            .upsert(true)
                            .await
                    {
                        self.record_lost(&e);
                    }
                    Ok(())
                },
                RELEASE_GRACE,
            )
            .map_err(|_| CommitError::Unavailable("ending the lease took too long".into()))?;
        ended.map_err(|e| self.unavailable(&e))
    }

    /// The lease's end and the record as one unordered `bulkWrite`: the record is written
    /// whether or not the lease was still this run's, and its failure alone is only logged.
    async fn end_in_one(
        &self,
        filter: &Document,
        update: &Document,
        runs: &mongodb::Collection<Document>,
        id: &Document,
        stored: &Document,
    ) -> std::result::Result<(), DriverError> {
        let models: Vec<WriteModel> = vec![
            UpdateOneModel::builder()
                .namespace(self.checkpoints.namespace())
                .filter(filter.clone())
                .update(update.clone())
                .build()
                .into(),
            ReplaceOneModel::builder()
                .namespace(runs.namespace())
                .filter(doc! { "_id": id.clone() })
                .replacement(stored.clone())
                .upsert(true)
                .build()
                .into(),
        ];
        match self
            .connection
            .client
            .bulk_write(models)
            .ordered(false)
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => match error.kind.as_ref() {
                ErrorKind::BulkWrite(failure)
                    if !failure.write_errors.contains_key(&0)
                        && failure.write_concern_errors.is_empty() =>
                {
                    self.record_lost(&error);
                    Ok(())
                }
                _ => Err(error),
            },
        }
    }

    fn record_lost(&self, error: &DriverError) {
        let error = self.connection.redact(&error.to_string());
        tracing::warn!(
            error = %escape_untrusted(&error, 500),
            "the run's record could not be kept in the run history; the run stands"
        );
    }
}
