//! A database's registry of handoff state collections ([`handoff_domain::state`]): every
//! command lists the collections it writes there before its first write, so that database and
//! deployment streams leave them out, whatever their names.

use bson::{Bson, DateTime, doc};

use super::connection::Connection;
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::state::{DEFAULT_NAMES, REGISTRY};

/// Lists `collections` of `database` in its registry: one `update` of upserts that only insert
/// (`$setOnInsert`), so a collection listed already writes nothing (and makes no event). A
/// default name needs no listing (every wide stream leaves it out): with only those, nothing is
/// sent.
pub async fn register(connection: &Connection, database: &str, collections: &[&str]) -> Result<()> {
    let now = DateTime::now();
    let updates: Vec<Bson> = collections
        .iter()
        .filter(|name| !DEFAULT_NAMES.contains(name))
        .map(|name| {
            Bson::Document(doc! {
                "q": { "_id": *name },
                "u": { "$setOnInsert": { "since": now } },
                "upsert": true,
            })
        })
        .collect();
    if updates.is_empty() {
        return Ok(());
    }
    let reply = connection
        .database(database)
        .run_command(doc! {
            "update": REGISTRY,
            "updates": updates,
            "ordered": false,
            "writeConcern": { "w": "majority" },
        })
        .await
        .map_err(|e| failed(connection, database, &e))?;
    // Two commands registering the same collection at once: one inserts, the other finds the
    // key taken (11000), which is as good.
    let refused = reply
        .get_array("writeErrors")
        .ok()
        .into_iter()
        .flatten()
        .filter_map(Bson::as_document)
        .find(|error| !matches!(error.get("code"), Some(Bson::Int32(11000))));
    let concern = reply.get_document("writeConcernError").ok();
    if let Some(error) = refused.or(concern) {
        let code = match error.get("code") {
            Some(Bson::Int32(code)) => Some(*code),
            _ => None,
        };
        let message = connection.redact(error.get_str("errmsg").unwrap_or_default());
        if code == Some(13) {
            return Err(HandoffError::unauthorized(&message));
        }
        return Err(HandoffError::Unavailable(format!(
            "the state collections could not be listed in {database}.{REGISTRY}: {message}"
        )));
    }
    Ok(())
}

fn failed(connection: &Connection, database: &str, error: &mongodb::error::Error) -> HandoffError {
    let message = connection.redact(&error.to_string());
    match error.kind.as_ref() {
        mongodb::error::ErrorKind::Command(c) if c.code == 13 => {
            HandoffError::unauthorized(&message)
        }
        _ => HandoffError::Unavailable(format!(
            "the state collections could not be listed in {database}.{REGISTRY}: {message}"
        )),
    }
}

impl Connection {
    /// [`register`], bounded by the run's deadline when one is set.
    pub fn register_state(&self, database: &str, collections: &[&str]) -> Result<()> {
        self.bounded(register(self, database, collections))
            .map_err(|_| {
                HandoffError::Unavailable(
                    "the run deadline passed while listing the state collections".into(),
                )
            })?
    }
}
