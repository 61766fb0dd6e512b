//! What a failed run tells the operator beyond its class: where the checkpoint stands against
//! the oplog, how much history is gone, and the exact commands to run next.
//!
//! Given for the failures an operator has to act on: history lost, an unusable token, a fatal
//! stream, a checkpoint of another source, a conflict. Times only, never the token itself.

use serde_json::{Value, json};

use handoff_domain::Collections;
use handoff_domain::config::{Scope, Watched};
use handoff_domain::deployment::{DEFAULT_CHECKPOINTS, DEFAULT_OUTBOX};
use handoff_domain::error::HandoffError;
use handoff_domain::position::{Position, iso};

/// What to do once a consumer's saved position can no longer be read from (history lost, a
/// token that cannot resume, a stream the server ended), in order. The one sequence the run's
/// `next_commands`, `--help`, the README and the engine examples' alerts give. First `recover`,
/// which does the rest in one audited command (a rerun completes it if it was stopped); then the
/// same by hand: see how big the gap is, look at the move, move the checkpoint to now, hand off
/// what comes after it, then repair through the policy the documents the gap left wrong and
/// check that nothing differs any more. A consumer of a database or deployment stream has
/// neither `recover` nor the reconcile steps (they compare one collection): it stops after `run`.
pub const RECOVERY_STEPS: [&str; 7] = [
    "recover --reason",
    "status",
    "checkpoint reset --to now --dry-run",
    "checkpoint reset --to now",
    "run",
    "reconcile --repair",
    "reconcile",
];

/// The steps that compare or repair one collection's documents, which a consumer of a wider
/// stream is not given.
const ONE_COLLECTION_STEPS: [&str; 3] = ["recover --reason", "reconcile --repair", "reconcile"];

/// A failed run's evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Evidence {
    pub position: Option<Position>,
    /// The commands to run next, in order, ready to paste (`MONGODB_URI` from the environment).
    pub next: Vec<String>,
}

impl Evidence {
    /// The evidence of `error`, for the classes that call for an operator.
    pub fn of(
        error: &HandoffError,
        position: Option<&Position>,
        consumer: &str,
        watched: Option<&Watched>,
        collections: Option<&Collections>,
    ) -> Option<Evidence> {
        let target = target_flags(consumer, watched, collections);
        let status = format!("handoff status {target}");
        let reset = |extra: &str| {
            format!("handoff checkpoint reset {target} --to now --reason '<why>'{extra}")
        };
        // Reconcile compares one collection with the outbox: a wider consumer has none.
        let one_collection = watched.is_none_or(|w| w.scope == Scope::Collection);
        let next = match error {
            // The saved position cannot be read from: reconcile (which reads the stream from
            // it) works again once the checkpoint was moved.
            HandoffError::HistoryLost(_)
            | HandoffError::InvalidToken(_)
            | HandoffError::StreamFatal(_) => RECOVERY_STEPS
                .iter()
                .filter(|step| one_collection || !ONE_COLLECTION_STEPS.contains(step))
                .map(|step| match *step {
                    "recover --reason" => format!("handoff recover {target} --reason '<why>'"),
                    "status" => status.clone(),
                    "checkpoint reset --to now --dry-run" => reset(" --dry-run"),
                    "checkpoint reset --to now" => reset(""),
                    "reconcile --repair" => {
                        format!("handoff reconcile {target} --repair --reason '<why>'")
                    }
                    other => format!("handoff {other} {target}"),
                })
                .collect(),
            HandoffError::Mismatch(_) => vec![status],
            HandoffError::Conflict(_) => vec![status],
            _ => return None,
        };
        Some(Evidence {
            position: position.cloned(),
            next,
        })
    }

    /// One sentence for the guidance output.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(position) = &self.position {
            match position.checkpoint {
                Some(t) => parts.push(format!(
                    "checkpoint at cluster time {}.{} ({})",
                    t.time,
                    t.increment,
                    iso(t)
                )),
                None => parts.push("checkpoint time unknown".into()),
            }
            match position.window {
                Some(window) => parts.push(format!(
                    "oldest oplog entry {}.{} ({})",
                    window.oldest.time,
                    window.oldest.increment,
                    iso(window.oldest)
                )),
                None => parts.push("oplog window unknown".into()),
            }
            if let Some(gap) = position.estimated_gap_seconds().filter(|g| *g > 0) {
                parts.push(format!("estimated gap {gap} s"));
            }
        }
        let mut text = String::new();
        if !parts.is_empty() {
            text.push_str(&format!("Evidence: {}.", parts.join(", ")));
        }
        if !self.next.is_empty() {
            if !text.is_empty() {
                text.push(' ');
            }
            // `recover` does the steps after it: those are the same by hand, not more to do.
            match self.next.split_first() {
                Some((recover, by_hand))
                    if recover.starts_with("handoff recover ") && !by_hand.is_empty() =>
                {
                    text.push_str(&format!(
                        "Next: {recover}; or, by hand: {}.",
                        by_hand.join("; then ")
                    ))
                }
                _ => text.push_str(&format!("Next: {}.", self.next.join("; then "))),
            }
        }
        text
    }

    pub fn to_json(&self) -> Value {
        let mut value = self
            .position
            .as_ref()
            .map_or_else(|| json!({}), Position::to_json);
        // Alternatives are kept apart: `next_commands` is one path, run in order; the same by
        // hand (after which a second move would skip what was written since) is another.
        match self.next.split_first() {
            Some((recover, by_hand))
                if recover.starts_with("handoff recover ") && !by_hand.is_empty() =>
            {
                value["next_commands"] = json!([recover]);
                value["next_commands_by_hand"] = json!(by_hand);
            }
            _ => value["next_commands"] = json!(self.next),
        }
        value
    }
}

/// `--database D --collection C --consumer-id X` (`--scope S --database D --consumer-id X` for
/// a database or deployment consumer) and the collections that are not the defaults, each
/// quoted for a POSIX shell when needed: how an operator command names the consumer.
pub fn target_flags(
    consumer: &str,
    watched: Option<&Watched>,
    collections: Option<&Collections>,
) -> String {
    let mut flags = Vec::new();
    if let Some(watched) = watched {
        if watched.scope != Scope::Collection {
            flags.push(format!("--scope {}", watched.scope.as_str()));
        }
        flags.push(format!("--database {}", shell_word(&watched.database)));
        if watched.scope == Scope::Collection {
            flags.push(format!("--collection {}", shell_word(&watched.collection)));
        }
    }
    flags.push(format!("--consumer-id {}", shell_word(consumer)));
    if let Some(c) = collections {
        if c.checkpoints != DEFAULT_CHECKPOINTS {
            flags.push(format!(
                "--checkpoint-collection {}",
                shell_word(&c.checkpoints)
            ));
        }
        if c.outbox != DEFAULT_OUTBOX {
            flags.push(format!("--outbox-collection {}", shell_word(&c.outbox)));
        }
    }
    flags.join(" ")
}

/// `text` as one word of a POSIX shell's command line: as it is when it needs no quoting, else
/// in single quotes.
pub fn shell_word(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@".contains(c));
    if plain {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::Timestamp;
    use handoff_domain::position::Window;

    #[test]
    fn history_lost_carries_times_gap_and_commands() {
        let position = Position {
            checkpoint: Some(Timestamp {
                time: 1_000,
                increment: 2,
            }),
            cluster_now: Some(Timestamp {
                time: 1_500,
                increment: 1,
            }),
            window: Some(Window {
                oldest: Timestamp {
                    time: 1_060,
                    increment: 1,
                },
                newest: Timestamp {
                    time: 1_500,
                    increment: 1,
                },
            }),
            wall_now: 1_500,
        };
        let evidence = Evidence::of(
            &HandoffError::HistoryLost("gone".into()),
            Some(&position),
            "it's",
            Some(&Watched {
                scope: Scope::Collection,
                database: "shop".into(),
                collection: "orders.eu".into(),
            }),
            Some(&Collections {
                checkpoints: DEFAULT_CHECKPOINTS.into(),
                outbox: "outbox_eu".into(),
                quarantine: "q".into(),
            }),
        )
        .expect("history lost has evidence");
        let summary = evidence.summary();
        assert!(
            summary.contains("checkpoint at cluster time 1000.2"),
            "{summary}"
        );
        assert!(summary.contains("oldest oplog entry 1060.1"), "{summary}");
        assert!(summary.contains("estimated gap 60 s"), "{summary}");
        let flags = "--database shop --collection orders.eu --consumer-id 'it'\\''s' --outbox-collection outbox_eu";
        assert_eq!(
            evidence.next[0],
            format!("handoff recover {flags} --reason '<why>'"),
        );
        assert_eq!(evidence.next[1], format!("handoff status {flags}"));
        assert!(
            evidence
                .next
                .iter()
                .any(|c| c.contains("checkpoint reset") && c.ends_with("--dry-run"))
        );
        let json = evidence.to_json();
        assert_eq!(json["estimated_gap_seconds"], 60);
        assert_eq!(json["next_commands"].as_array().map(Vec::len), Some(1));
        assert_eq!(
            json["next_commands_by_hand"].as_array().map(Vec::len),
            Some(6)
        );
        assert!(
            summary.contains("Next: handoff recover --database shop"),
            "{summary}"
        );
        assert!(
            summary.contains("; or, by hand: handoff status --database shop"),
            "{summary}"
        );
    }

    #[test]
    fn a_wide_consumers_commands_name_its_scope_and_no_reconcile() {
        let collections = Collections {
            checkpoints: "cp_eu".into(),
            outbox: DEFAULT_OUTBOX.into(),
            quarantine: "q".into(),
        };
        for (scope, flags) in [
            (
                Scope::Database,
                "--scope database --database shop --consumer-id wide --checkpoint-collection cp_eu",
            ),
            (
                Scope::Deployment,
                "--scope deployment --database shop --consumer-id wide --checkpoint-collection cp_eu",
            ),
        ] {
            let watched = Watched {
                scope,
                database: "shop".into(),
                collection: "orders".into(),
            };
            let evidence = Evidence::of(
                &HandoffError::HistoryLost("gone".into()),
                None,
                "wide",
                Some(&watched),
                Some(&collections),
            )
            .expect("history lost has evidence");
            assert_eq!(
                evidence.next,
                [
                    format!("handoff status {flags}"),
                    format!("handoff checkpoint reset {flags} --to now --reason '<why>' --dry-run"),
                    format!("handoff checkpoint reset {flags} --to now --reason '<why>'"),
                    format!("handoff run {flags}"),
                ]
            );
        }
    }

    #[test]
    fn only_the_operator_classes_have_evidence() {
        assert!(Evidence::of(&HandoffError::BadInput("x".into()), None, "c", None, None).is_none());
        assert!(Evidence::of(&HandoffError::Policy("x".into()), None, "c", None, None).is_none());
        let conflict = Evidence::of(&HandoffError::Conflict("x".into()), None, "c", None, None)
            .expect("a conflict names status");
        assert_eq!(
            conflict.next,
            vec!["handoff status --consumer-id c".to_string()]
        );
        assert_eq!(conflict.summary(), "Next: handoff status --consumer-id c.");
    }
}
