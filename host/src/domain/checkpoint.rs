//! The checkpoint document: created as the baseline creates it, and refused when it belongs to
//! another deployment or has a shape neither this tool nor the baseline writes.

use bson::{Bson, Document, doc};

use crate::error::{HandoffError, Result};

/// How a saved token resumes a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    ResumeAfter,
    StartAfter,
}

impl Mode {
    /// The name stored in the checkpoint document, as the baseline writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ResumeAfter => "resumeAfter",
            Mode::StartAfter => "startAfter",
        }
    }

    pub fn parse(name: &str) -> Option<Mode> {
        match name {
            "resumeAfter" => Some(Mode::ResumeAfter),
            "startAfter" => Some(Mode::StartAfter),
            _ => None,
        }
    }
}

/// A checkpoint as loaded and validated before the run: the token (none for a fresh consumer)
/// and the mode it must be resumed with.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub token: Option<Document>,
    pub mode: Mode,
}

/// A new checkpoint: `_id` plus the baseline's `$setOnInsert` fields, in its order.
pub fn initial(consumer: &str, source: &str, replica_set_id: &str) -> Document {
    doc! {
        "_id": consumer,
        "source": source,
        "replicaSetId": replica_set_id,
        "token": Bson::Null,
        "mode": Mode::ResumeAfter.as_str(),
    }
}

/// Checks a loaded checkpoint in the baseline's order: source, replica set, shape.
pub fn validate(stored: &Document, source: &str, replica_set_id: &str) -> Result<Checkpoint> {
    if stored.get_str("source").ok() != Some(source) {
        return Err(HandoffError::Mismatch(
            "Consumer checkpoint belongs to another source; use the original source or a new consumer_id".into(),
        ));
    }
    if stored.get_str("replicaSetId").ok() != Some(replica_set_id) {
        return Err(HandoffError::Mismatch(
            "Consumer checkpoint belongs to another replica set; reconcile from a verified snapshot before reset"
                .into(),
        ));
    }
    let malformed = || {
        HandoffError::MalformedCheckpoint(
            "Checkpoint is malformed; restore a verified token before retrying".into(),
        )
    };
    let mode = match stored.get("mode") {
        None => Mode::ResumeAfter,
        Some(Bson::String(name)) => Mode::parse(name).ok_or_else(malformed)?,
        Some(_) => return Err(malformed()),
    };
    let token = match stored.get("token") {
        None | Some(Bson::Null) => None,
        Some(Bson::Document(token)) if is_resume_token(token) => Some(token.clone()),
        Some(_) => return Err(malformed()),
    };
    Ok(Checkpoint { token, mode })
}

/// The longest `_data` accepted (a real token is well under 1 KiB; one naming a large
/// document key can be longer).
const MAX_TOKEN_DATA: usize = 64 << 10;

/// A resume token as MongoDB writes it: `_data`, a non-empty string of hex digits, and optionally
/// `_typeBits` (binary), nothing else.
pub fn is_resume_token(token: &Document) -> bool {
    let data_ok = matches!(token.get("_data"), Some(Bson::String(data))
        if !data.is_empty()
            && data.len() <= MAX_TOKEN_DATA
            && data.bytes().all(|b| b.is_ascii_hexdigit()));
    data_ok
        && token.iter().all(|(key, value)| match key.as_str() {
            "_data" => true,
            "_typeBits" => matches!(value, Bson::Binary(_)),
            _ => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RS: &str = "65f000000000000000000001";

    #[test]
    fn a_new_checkpoint_validates() {
        let c = validate(&initial("c", "db.c", RS), "db.c", RS).unwrap();
        assert_eq!(
            c,
            Checkpoint {
                token: None,
                mode: Mode::ResumeAfter
            }
        );
    }

    #[test]
    fn mismatches_and_malformed_shapes_are_refused() {
        let mut other_rs = initial("c", "db.c", RS);
        other_rs.insert("replicaSetId", "65f000000000000000000002");
        assert!(
            matches!(validate(&initial("c", "db.x", RS), "db.c", RS), Err(HandoffError::Mismatch(m)) if m.contains("another source"))
        );
        assert!(
            matches!(validate(&other_rs, "db.c", RS), Err(HandoffError::Mismatch(m)) if m.contains("another replica set"))
        );
        for (key, value) in [
            ("token", Bson::String("8200".into())),
            ("token", Bson::Int32(1)),
            ("mode", Bson::String("startAtOperationTime".into())),
            ("mode", Bson::Int32(1)),
        ] {
            let mut c = initial("c", "db.c", RS);
            c.insert(key, value);
            assert!(
                matches!(
                    validate(&c, "db.c", RS),
                    Err(HandoffError::MalformedCheckpoint(_))
                ),
                "{key}"
            );
        }
    }

    #[test]
    fn tokens_of_another_shape_are_malformed() {
        let binary = Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes: vec![1],
        });
        for token in [
            doc! {},
            doc! {"_data": ""},
            doc! {"_data": "82zz"},
            doc! {"_data": 82},
            doc! {"_data": "82", "extra": 1},
            doc! {"_data": "82", "_typeBits": "x"},
            doc! {"_data": "8".repeat(MAX_TOKEN_DATA + 1)},
            doc! {"_typeBits": binary.clone()},
        ] {
            let mut c = initial("c", "db.c", RS);
            c.insert("token", token.clone());
            assert!(
                matches!(
                    validate(&c, "db.c", RS),
                    Err(HandoffError::MalformedCheckpoint(_))
                ),
                "{token}"
            );
        }
        let mut c = initial("c", "db.c", RS);
        c.insert("token", doc! {"_data": "826AE70DA0", "_typeBits": binary});
        assert!(validate(&c, "db.c", RS).unwrap().token.is_some());
    }

    #[test]
    fn a_missing_mode_means_resume_after() {
        let mut c = initial("c", "db.c", RS);
        c.remove("mode");
        c.insert("token", doc! {"_data": "82"});
        let loaded = validate(&c, "db.c", RS).unwrap();
        assert_eq!(loaded.mode, Mode::ResumeAfter);
        assert_eq!(loaded.token, Some(doc! {"_data": "82"}));
    }
}
