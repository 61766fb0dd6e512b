//! The run's inputs, validated exactly as the baseline task validates them.

use handoff_domain::error::{HandoffError, Result};

/// Raw inputs as given by flags or the baseline's environment variables.
#[derive(Clone, Debug)]
pub struct RawInputs {
    pub database: String,
    pub collection: String,
    pub consumer_id: String,
    pub checkpoint_collection: String,
    pub outbox_collection: String,
    pub quarantine_collection: String,
    /// The run history's collection ([`handoff_domain::history`]).
    pub runs_collection: String,
    /// Run records kept per consumer.
    pub runs_keep: u32,
    pub max_events: String,
    pub max_wait_seconds: String,
}

/// Inputs that passed validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inputs {
    pub database: String,
    pub collection: String,
    pub consumer_id: String,
    pub checkpoint_collection: String,
    pub outbox_collection: String,
    pub quarantine_collection: String,
    pub runs_collection: String,
    pub runs_keep: u32,
    pub max_events: u32,
    pub max_wait_seconds: u32,
}

impl Inputs {
    /// The watched namespace, `database.collection`, as the checkpoint records it.
    pub fn source(&self) -> String {
        format!("{}.{}", self.database, self.collection)
    }

    /// Where the consumer's checkpoint, outbox and quarantine records live.
    pub fn collections(&self) -> handoff_domain::Collections {
        handoff_domain::Collections {
            checkpoints: self.checkpoint_collection.clone(),
            outbox: self.outbox_collection.clone(),
            quarantine: self.quarantine_collection.clone(),
        }
    }
}

/// `[A-Za-z][A-Za-z0-9_-]{0,62}`, as the baseline requires of every name.
pub fn valid_name(value: &str) -> bool {
    let mut chars = value.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && value.len() <= 63
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn name(key: &str, value: &str) -> Result<String> {
    if valid_name(value) {
        Ok(value.to_string())
    } else {
        Err(HandoffError::BadInput(format!(
            "{key} must contain 1-63 letters, digits, underscores or hyphens and start with a letter"
        )))
    }
}

/// The most run records a consumer may keep.
pub const MAX_RUNS_KEPT: u32 = 100_000;

const LIMITS: &str = "max_events must be 1-500 and max_wait_seconds must be 1-30";

fn limit(key: &str, value: &str, range: std::ops::RangeInclusive<i64>) -> Result<u32> {
    let parsed: i64 = value
        .trim()
        .parse()
        .map_err(|_| HandoffError::BadInput(format!("{key} must be an integer; {LIMITS}")))?;
    if !range.contains(&parsed) {
        return Err(HandoffError::BadInput(LIMITS.to_string()));
    }
    u32::try_from(parsed).map_err(|_| HandoffError::BadInput(LIMITS.to_string()))
}

impl RawInputs {
    pub fn validate(&self) -> Result<Inputs> {
        let database = name("SOURCE_DATABASE", &self.database)?;
        let collection = name("SOURCE_COLLECTION", &self.collection)?;
        let consumer_id = name("CONSUMER_ID", &self.consumer_id)?;
        let checkpoint_collection = name("CHECKPOINT_COLLECTION", &self.checkpoint_collection)?;
        let outbox_collection = name("OUTBOX_COLLECTION", &self.outbox_collection)?;
        let quarantine_collection =
            name("HANDOFF_QUARANTINE_COLLECTION", &self.quarantine_collection)?;
        if collection == checkpoint_collection
            || collection == outbox_collection
            || checkpoint_collection == outbox_collection
        {
            return Err(HandoffError::BadInput(
                "The source, checkpoint and outbox collection names must be distinct".to_string(),
            ));
        }
        if [&collection, &checkpoint_collection, &outbox_collection]
            .contains(&&quarantine_collection)
        {
            return Err(HandoffError::BadInput(
                "The quarantine collection must be distinct from the source, checkpoint and outbox collections"
                    .to_string(),
            ));
        }
        let runs_collection = name("HANDOFF_RUNS_COLLECTION", &self.runs_collection)?;
        // Nor another state collection's default name, nor the registry: records upserted
        // there would land in an audit trail or make every wide stream read the registry again.
        let reserved = handoff_domain::state::DEFAULT_NAMES
            .iter()
            .filter(|name| **name != handoff_domain::history::DEFAULT_RUNS)
            .chain([&handoff_domain::state::REGISTRY])
            .any(|name| *name == runs_collection);
        if reserved
            || [
                &collection,
                &checkpoint_collection,
                &outbox_collection,
                &quarantine_collection,
            ]
            .contains(&&runs_collection)
        {
            return Err(HandoffError::BadInput(
                "The runs collection must be distinct from the source, checkpoint, outbox and quarantine collections"
                    .to_string(),
            ));
        }
        if !(1..=MAX_RUNS_KEPT).contains(&self.runs_keep) {
            return Err(HandoffError::BadInput(format!(
                "HANDOFF_RUNS_KEEP must be 1-{MAX_RUNS_KEPT}"
            )));
        }
        let max_events = limit("MAX_EVENTS", &self.max_events, 1..=500)?;
        let max_wait_seconds = limit("MAX_WAIT_SECONDS", &self.max_wait_seconds, 1..=30)?;
        Ok(Inputs {
            database,
            collection,
            consumer_id,
            checkpoint_collection,
            outbox_collection,
            quarantine_collection,
            runs_collection,
            runs_keep: self.runs_keep,
            max_events,
            max_wait_seconds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawInputs {
        RawInputs {
            database: "change_demo".into(),
            collection: "orders".into(),
            consumer_id: "orders-to-outbox".into(),
            checkpoint_collection: "kestra_change_checkpoints".into(),
            outbox_collection: "kestra_change_outbox".into(),
            quarantine_collection: "kestra_change_quarantine".into(),
            runs_collection: "kestra_change_runs".into(),
            runs_keep: 1000,
            max_events: "50".into(),
            max_wait_seconds: "10".into(),
        }
    }

    #[test]
    fn defaults_of_the_flow_are_valid() {
        let inputs = raw().validate().unwrap();
        assert_eq!(inputs.source(), "change_demo.orders");
        assert_eq!((inputs.max_events, inputs.max_wait_seconds), (50, 10));
    }

    #[test]
    fn names_follow_the_baseline_rule() {
        for bad in ["", "1abc", "a.b", "a b", "ä", &"a".repeat(64), "a$"] {
            let mut r = raw();
            r.consumer_id = bad.to_string();
            let err = r.validate().unwrap_err();
            assert!(matches!(err, HandoffError::BadInput(_)));
            assert!(
                err.to_string().starts_with("CONSUMER_ID must contain"),
                "{err}"
            );
        }
        for good in ["a", "A-_9", &"a".repeat(63)] {
            let mut r = raw();
            r.consumer_id = good.to_string();
            assert!(r.validate().is_ok(), "{good}");
        }
    }

    #[test]
    fn collections_must_be_distinct() {
        let mut r = raw();
        r.outbox_collection = r.checkpoint_collection.clone();
        assert!(
            r.validate()
                .unwrap_err()
                .to_string()
                .contains("must be distinct")
        );
        let mut r = raw();
        r.collection = r.outbox_collection.clone();
        assert!(r.validate().is_err());
        let mut r = raw();
        r.quarantine_collection = r.checkpoint_collection.clone();
        assert!(
            r.validate()
                .unwrap_err()
                .to_string()
                .contains("quarantine collection must be distinct")
        );
        for reserved in ["kestra_change_audit", "kestra_change_registry"] {
            let mut r = raw();
            r.runs_collection = reserved.into();
            assert!(r.validate().is_err(), "{reserved}");
        }
        let mut r = raw();
        r.runs_collection = r.outbox_collection.clone();
        assert!(
            r.validate()
                .unwrap_err()
                .to_string()
                .contains("runs collection must be distinct")
        );
        for keep in [0, MAX_RUNS_KEPT + 1] {
            let mut r = raw();
            r.runs_keep = keep;
            assert!(
                r.validate()
                    .unwrap_err()
                    .to_string()
                    .contains("HANDOFF_RUNS_KEEP")
            );
        }
    }

    #[test]
    fn limits_follow_the_baseline() {
        for (events, wait, ok) in [
            ("1", "1", true),
            ("500", "30", true),
            ("0", "10", false),
            ("501", "10", false),
            ("50", "0", false),
            ("50", "31", false),
            ("-1", "10", false),
            ("abc", "10", false),
            ("50", "1.5", false),
            ("99999999999999999999", "10", false),
        ] {
            let mut r = raw();
            r.max_events = events.into();
            r.max_wait_seconds = wait.into();
            assert_eq!(r.validate().is_ok(), ok, "{events} {wait}");
        }
    }
}
