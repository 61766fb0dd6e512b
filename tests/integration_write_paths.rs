//! A model-based test of every command that writes a consumer's records, end to end against the
//! test server, with the quarantine policy deciding: a seeded sequence of steps — application
//! writes (good documents, `schemaVersion: 1`, and poison ones, `schemaVersion: 99` with a card
//! number), `handoff run`, `handoff backfill` (small chunks, sometimes `--restart`), `handoff
//! reconcile --repair`, `handoff checkpoint reset --to-time` back to a cluster time seen earlier,
//! and kills of a spawned run, backfill or repair after a random short delay. After every step:
//!
//! 1. every outbox record is one the quarantine policy produces: no event with a `fullDocument`
//!    of a schema version other than 1 (a delete, an update whose document was gone at lookup, a
//!    snapshot of nothing carry none), and the card number is nowhere in the outbox; every
//!    quarantine record holds a document of another schema version or an update that sets one;
//!    no outbox record is an update that sets one;
//! 2. each event at most once per consumer: no two outbox records hold the same event (its
//!    token's canonical text), nor two quarantine records;
//! 3. every change event the consumer's runs passed (after the position the consumer started at,
//!    up to the furthest position its checkpoint has held) has a record: an insert or replace of
//!    a poison document in the quarantine, of a good one in the outbox, a delete in the outbox,
//!    an update in one of the two (its document is looked up when a run reads it, so what it
//!    holds depends on when that was).
//!
//! At the end a run catches up, the invariants hold, and `reconcile` with the quarantine policy
//! reports 0 missing, 0 orphan, 0 stale, nothing in flight (exit 0).
//!
//! The plan is drawn from a seeded generator before anything runs, printed with its seed
//! (`HANDOFF_WRITE_PATHS_SEED=<seed>` replays it); what a kill interrupts depends on timing.
//!
//! Poison documents are written whole (inserts and replaces) or made poison with a `$set` of the
//! schema version alone: an update event holds the fields it set (`updateDescription`) and the
//! document as it is when a run reads it (`updateLookup`), so a `$set` of the card number
//! followed by a good version before the run reads it would be handed off with the number in its
//! `updatedFields`: the quarantine policy judges the document's schema version and the version an
//! update sets, not the other fields.

use crate::support;

use std::collections::{BTreeMap, HashSet};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use handoff::domain::token::{canonical_text, cluster_time};
use mongo_sim::Config;
use serde_json::Value;
use support::Rng;
use support::live::*;

const QUARANTINE: &str = "kestra_change_quarantine";
const CARD: &str = "4111111111111111";
/// Document keys 1..=KEYS.
const KEYS: u64 = 40;

/// The consumer's policy, on every command that decides.
fn policy() -> [&'static str; 2] {
    ["--policy", handoff_test_policies::QUARANTINE]
}

/// One application write to the watched collection.
#[derive(Clone, Debug)]
enum Write {
    Insert {
        key: i32,
        poison: bool,
    },
    Replace {
        key: i32,
        poison: bool,
    },
    /// `$inc: {qty: 1}`: keeps the document good or poison.
    Bump {
        key: i32,
    },
    /// `$set: {schemaVersion: 1}, $unset: {card}`.
    MakeGood {
        key: i32,
    },
    /// `$set: {schemaVersion: 99}` (no card number in the update).
    MakePoison {
        key: i32,
    },
    Delete {
        key: i32,
    },
}

/// What a kill step spawns.
#[derive(Clone, Debug)]
enum Target {
    Run,
    Backfill { chunk: u32, restart: bool },
    Repair,
}

#[derive(Clone, Debug)]
enum Step {
    Writes(Vec<Write>),
    Run,
    Backfill {
        chunk: u32,
        restart: bool,
    },
    Repair,
    /// `checkpoint reset --to-time` one of the cluster times the consumer passed, the `pick`-th
    /// modulo their number.
    Reset {
        pick: u64,
    },
    /// Spawns `target`, makes `writes` while it works, kills it `after_ms` after its start.
    Kill {
        target: Target,
        after_ms: u64,
        writes: Vec<Write>,
    },
}

/// The source as the plan has written it: key → poison.
type Model = BTreeMap<i32, bool>;

fn draw_writes(rng: &mut Rng, model: &mut Model, count: u64) -> Vec<Write> {
    (0..count)
        .map(|_| {
            let key = 1 + rng.below(KEYS) as i32;
            let write = match model.get(&key).copied() {
                None => Write::Insert {
                    key,
                    poison: rng.below(3) == 0,
                },
                Some(poison) => match rng.below(10) {
                    0..=2 => Write::Replace {
                        key,
                        poison: rng.below(3) == 0,
                    },
                    3..=4 => Write::Bump { key },
                    5..=6 if poison => Write::MakeGood { key },
                    5..=6 => Write::MakePoison { key },
                    _ => Write::Delete { key },
                },
            };
            match &write {
                Write::Insert { poison, .. } | Write::Replace { poison, .. } => {
                    model.insert(key, *poison);
                }
                Write::MakeGood { .. } => {
                    model.insert(key, false);
                }
                Write::MakePoison { .. } => {
                    model.insert(key, true);
                }
                Write::Delete { .. } => {
                    model.remove(&key);
                }
                Write::Bump { .. } => {}
            }
            write
        })
        .collect()
}

fn chunk_size(rng: &mut Rng) -> u32 {
    [2, 3, 5, 8, 13][rng.below(5) as usize]
}

/// The initial documents, and the steps: 25-40 of them, the first starting the consumer: a
/// backfill (which hands off the documents already there), or a run (which starts after them:
/// they are missing from the outbox until a repair, which the plan then holds, hands them off).
fn plan(rng: &mut Rng) -> (Vec<Write>, Vec<Step>, Model) {
    let mut model = Model::new();
    let initial = rng.below(16);
    let initial_writes = draw_writes(rng, &mut model, initial);
    let count = 25 + rng.below(16);
    let mut steps = Vec::with_capacity(count as usize);
    let late = rng.below(2) == 0;
    steps.push(if late {
        Step::Run
    } else {
        Step::Backfill {
            chunk: chunk_size(rng),
            restart: false,
        }
    });
    while (steps.len() as u64) < count {
        let step = match rng.below(100) {
            0..=33 => {
                let n = 1 + rng.below(6);
                Step::Writes(draw_writes(rng, &mut model, n))
            }
            34..=51 => Step::Run,
            52..=61 => Step::Backfill {
                chunk: chunk_size(rng),
                restart: rng.below(2) == 0,
            },
            62..=73 => Step::Repair,
            74..=81 => Step::Reset { pick: rng.next() },
            _ => {
                let target = match rng.below(3) {
                    0 => Target::Run,
                    1 => Target::Backfill {
                        chunk: chunk_size(rng),
                        restart: rng.below(2) == 0,
                    },
                    _ => Target::Repair,
                };
                // A few milliseconds to a few hundred.
                let span = if rng.below(2) == 0 { 60 } else { 400 };
                let after_ms = 3 + rng.below(span);
                let n = rng.below(3);
                Step::Kill {
                    target,
                    after_ms,
                    writes: draw_writes(rng, &mut model, n),
                }
            }
        };
        steps.push(step);
    }
    if late && initial > 0 && !steps.iter().any(|s| matches!(s, Step::Repair)) {
        // In place of a step that writes nothing (the plan's writes stay as drawn).
        let quiet: Vec<usize> = (1..steps.len())
            .filter(|i| match &steps[*i] {
                Step::Writes(_) => false,
                Step::Kill { writes, .. } => writes.is_empty(),
                _ => true,
            })
            .collect();
        let at = quiet[rng.below(quiet.len() as u64) as usize];
        steps[at] = Step::Repair;
    }
    (initial_writes, steps, model)
}

/// A command of `handoff` on the test's deployment and database.
fn command(live: &Live, args: &[&str]) -> Command {
    let mut command = support::handoff();
    command
        .args(args)
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .env_remove(support::env_names::AUDIT_COLLECTION)
        .env_remove("HANDOFF_OPERATOR");
    command
}

fn backfill_args(chunk: u32, restart: bool) -> Vec<String> {
    let mut args: Vec<String> = ["backfill", "--json", "--reason", "model test: load"]
        .into_iter()
        .chain(policy())
        .map(String::from)
        .collect();
    args.extend(["--chunk-size".to_string(), chunk.to_string()]);
    if restart {
        args.push("--restart".into());
    }
    args
}

fn repair_args() -> Vec<String> {
    [
        "reconcile",
        "--json",
        "--repair",
        "--reason",
        "model test: repair",
    ]
    .into_iter()
    .chain(policy())
    .map(String::from)
    .collect()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn text(output: &Output) -> String {
    format!(
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        support::stderr(output)
    )
}

/// The `_data` of a token.
fn data(token: &Document) -> String {
    token_hex(token)
}

/// What the test knows besides the server: the seed, where history starts, how far the
/// consumer's checkpoint has been.
struct Harness {
    live: Live,
    seed: u64,
    /// The position before the first write: history is read from here.
    initial: Document,
    /// The first token the consumer's checkpoint was seen holding: events up to it were never
    /// the consumer's to pass.
    origin: Option<String>,
    /// The furthest token the checkpoint was seen holding.
    high: Option<String>,
    /// Distinguishes the documents written.
    writes: i64,
    model: Model,
}

impl Harness {
    fn document(&self, key: i32, poison: bool) -> Document {
        if poison {
            doc! { "_id": key, "schemaVersion": 99, "card": CARD, "qty": self.writes }
        } else {
            doc! { "_id": key, "schemaVersion": 1, "sku": format!("SKU-{key}"), "qty": self.writes }
        }
    }

    fn write(&mut self, write: &Write, ctx: &str) {
        self.writes += 1;
        let orders = self.live.coll("orders");
        let matched = |n: u64, what: &str| {
            assert_eq!(
                n, 1,
                "[{ctx}] the application's {what} matched {n} documents"
            );
        };
        match *write {
            Write::Insert { key, poison } => {
                let document = self.document(key, poison);
                self.live
                    .wait(orders.insert_one(document))
                    .unwrap_or_else(|e| panic!("[{ctx}] insert {key}: {e}"));
                self.model.insert(key, poison);
            }
            Write::Replace { key, poison } => {
                let document = self.document(key, poison);
                let r = self
                    .live
                    .wait(orders.replace_one(doc! { "_id": key }, document))
                    .unwrap_or_else(|e| panic!("[{ctx}] replace {key}: {e}"));
                matched(r.matched_count, "replace");
                self.model.insert(key, poison);
            }
            Write::Bump { key } => {
                let r = self
                    .live
                    .wait(orders.update_one(doc! { "_id": key }, doc! { "$inc": { "qty": 1 } }))
                    .unwrap_or_else(|e| panic!("[{ctx}] update {key}: {e}"));
                matched(r.matched_count, "update");
            }
            Write::MakeGood { key } => {
                let r = self
                    .live
                    .wait(orders.update_one(
                        doc! { "_id": key },
                        doc! {
                            "$set": { "schemaVersion": 1, "sku": format!("SKU-{key}") },
                            "$unset": { "card": "" },
                        },
                    ))
                    .unwrap_or_else(|e| panic!("[{ctx}] update {key}: {e}"));
                matched(r.matched_count, "update");
                self.model.insert(key, false);
            }
            Write::MakePoison { key } => {
                let r = self
                    .live
                    .wait(orders.update_one(
                        doc! { "_id": key },
                        doc! { "$set": { "schemaVersion": 99 } },
                    ))
                    .unwrap_or_else(|e| panic!("[{ctx}] update {key}: {e}"));
                matched(r.matched_count, "update");
                self.model.insert(key, true);
            }
            Write::Delete { key } => {
                let r = self
                    .live
                    .wait(orders.delete_one(doc! { "_id": key }))
                    .unwrap_or_else(|e| panic!("[{ctx}] delete {key}: {e}"));
                assert_eq!(r.deleted_count, 1, "[{ctx}] delete {key} deleted nothing");
                self.model.remove(&key);
            }
        }
    }

    /// Ends the lease a killed run may hold, as time would (`Live::expire_lease`), on a
    /// checkpoint that names a holder: one a run never claimed has neither `owner` nor
    /// `leaseUntil`, and `leaseUntil` alone would make it malformed.
    fn expire_lease(&self) {
        self.live
            .wait(self.live.coll(CHECKPOINTS).update_one(
                doc! { "_id": CONSUMER, "owner": { "$exists": true } },
                doc! { "$set": { "leaseUntil": bson::DateTime::from_millis(0) } },
            ))
            .expect("expire the lease");
    }

    /// The checkpoint's token, if it holds one.
    fn checkpoint_token(&self) -> Option<Document> {
        self.live
            .checkpoint()
            .and_then(|c| c.get_document("token").ok().cloned())
    }

    /// Every change event of the watched collection since the test began (no looked-up
    /// documents: an update carries none).
    fn history(&self) -> Vec<Document> {
        self.live.events_after(&self.initial)
    }

    /// Asserts the three invariants (see the module's documentation).
    fn check(&mut self, ctx: &str) {
        // The checkpoint first: what a commit wrote with it is then visible in the records read
        // after it (a killed process's last commit may still land meanwhile).
        if let Some(token) = self.checkpoint_token() {
            let at = data(&token);
            if self.origin.is_none() {
                self.origin = Some(at.clone());
            }
            if self.high.as_ref().is_none_or(|high| at > *high) {
                self.high = Some(at);
            }
        }
        let outbox = self.live.outbox();
        let quarantine = self.live.records(QUARANTINE);

        // 1. What the quarantine policy produces.
        let mut handed_off = HashSet::new();
        for record in &outbox {
            let shown = || format!("{record}");
            let event = record.get_document("event").unwrap_or_else(|_| {
                panic!("[{ctx}] an outbox record without its event: {}", shown())
            });
            assert_eq!(
                record.get_str("consumer").ok(),
                Some(CONSUMER),
                "[{ctx}] {}",
                shown()
            );
            let token = event
                .get_document("_id")
                .unwrap_or_else(|_| panic!("[{ctx}] an event without a token: {}", shown()));
            let id = event_id(event);
            assert_eq!(
                record.get_str("_id").ok(),
                Some(format!("{CONSUMER}/{id}").as_str()),
                "[{ctx}] an outbox _id is not its event's ID: {}",
                shown()
            );
            let operation = event.get_str("operationType").unwrap_or_default();
            assert!(
                ["insert", "update", "replace", "delete", "snapshot"].contains(&operation),
                "[{ctx}] an outbox record of a {operation} event: {}",
                shown()
            );
            match event.get("fullDocument") {
                Some(Bson::Document(document)) => assert!(
                    good(document),
                    "[{ctx}] INVARIANT 1: the outbox holds a {operation} event of a document the \
                     quarantine policy refuses: {}",
                    shown()
                ),
                None | Some(Bson::Null) => assert!(
                    !["insert", "replace"].contains(&operation),
                    "[{ctx}] an {operation} event without its document: {}",
                    shown()
                ),
                Some(other) => panic!("[{ctx}] a fullDocument {other}: {}", shown()),
            }
            if let Some(set) = sets_version(event) {
                assert!(
                    matches!(set, Bson::Int32(1) | Bson::Int64(1)),
                    "[{ctx}] INVARIANT 1: the outbox holds an update that sets a schema version \
                     the quarantine policy refuses: {}",
                    shown()
                );
            }
            // 2. At most once in the outbox.
            assert!(
                handed_off.insert(canonical_text(token)),
                "[{ctx}] INVARIANT 2: event {} handed off twice (second record {})",
                canonical_text(token),
                shown()
            );
        }
        let everything = format!("{outbox:?}");
        assert!(
            !everything.contains(CARD),
            "[{ctx}] INVARIANT 1: the card number reached the outbox: {}",
            outbox
                .iter()
                .find(|r| format!("{r:?}").contains(CARD))
                .map(|r| r.to_string())
                .unwrap_or_default()
        );
        let mut held = HashSet::new();
        for record in &quarantine {
            let shown = || format!("{record}");
            let event = record.get_document("event").unwrap_or_else(|_| {
                panic!("[{ctx}] a quarantine record without its event: {}", shown())
            });
            let token = event
                .get_document("_id")
                .unwrap_or_else(|_| panic!("[{ctx}] an event without a token: {}", shown()));
            assert_eq!(
                record.get_str("_id").ok(),
                Some(format!("{CONSUMER}/{}", event_id(event)).as_str()),
                "[{ctx}] a quarantine _id is not its event's ID: {}",
                shown()
            );
            assert_eq!(
                record.get_document("token").ok(),
                Some(token),
                "[{ctx}] a quarantine record's token is not its event's: {}",
                shown()
            );
            assert!(
                record
                    .get_str("reason")
                    .is_ok_and(|r| r.contains("schemaVersion")),
                "[{ctx}] a quarantine record without the policy's reason: {}",
                shown()
            );
            match (event.get("fullDocument"), sets_version(event)) {
                // An update that sets an unsupported version is refused whatever its lookup
                // found (the document may have been made good or gone since).
                (_, Some(set)) if set != Bson::Int32(1) && set != Bson::Int64(1) => {}
                (Some(Bson::Document(document)), _) => assert!(
                    !good(document),
                    "[{ctx}] INVARIANT 1: the quarantine holds a good document: {}",
                    shown()
                ),
                _ => panic!(
                    "[{ctx}] INVARIANT 1: the quarantine holds an event without a document \
                     or a refused update: {}",
                    shown()
                ),
            }
            // 2. At most once in the quarantine.
            assert!(
                held.insert(canonical_text(token)),
                "[{ctx}] INVARIANT 2: event {} quarantined twice (second record {})",
                canonical_text(token),
                shown()
            );
        }

        // 3. Every change event passed has its record.
        let (Some(origin), Some(high)) = (&self.origin, &self.high) else {
            return;
        };
        for event in self.history() {
            let token = event.get_document("_id").expect("an event's token");
            let at = data(token);
            if at <= *origin || at > *high {
                continue;
            }
            let text = canonical_text(token);
            let operation = event.get_str("operationType").unwrap_or_default();
            let key = event
                .get_document("documentKey")
                .ok()
                .and_then(|k| k.get("_id"))
                .cloned()
                .unwrap_or(Bson::Null);
            let shown = format!(
                "{operation} of key {key} at {:?} ({text})",
                cluster_time(token)
            );
            match event.get("fullDocument") {
                // A delete holds no document: the policy hands it off.
                _ if operation == "delete" => assert!(
                    handed_off.contains(&text),
                    "[{ctx}] INVARIANT 3: the {shown} the consumer passed (checkpoint reached \
                     {high}) is not in the outbox"
                ),
                Some(Bson::Document(document)) if !good(document) => assert!(
                    held.contains(&text),
                    "[{ctx}] INVARIANT 3: a poison {shown} the consumer passed (checkpoint \
                     reached {high}) has no quarantine record"
                ),
                Some(Bson::Document(_)) => assert!(
                    handed_off.contains(&text),
                    "[{ctx}] INVARIANT 3: a good {shown} the consumer passed (checkpoint \
                     reached {high}) is not in the outbox"
                ),
                _ => assert!(
                    handed_off.contains(&text) || held.contains(&text),
                    "[{ctx}] INVARIANT 3: the {shown} the consumer passed (checkpoint reached \
                     {high}) is neither handed off nor quarantined"
                ),
            }
        }
    }

    /// Asserts the checkpoint has nothing after it: a finished run caught up.
    fn assert_caught_up(&self, ctx: &str) {
        let token = self
            .checkpoint_token()
            .unwrap_or_else(|| panic!("[{ctx}] no checkpoint token after a run"));
        let after = self.live.events_after(&token);
        assert!(
            after.is_empty(),
            "[{ctx}] {} events remain after the checkpoint a finished run left",
            after.len()
        );
    }

    fn run(&self, ctx: &str) -> Value {
        let out = self.live.run(&policy());
        expect_exit(&out, &[0], ctx, "handoff run");
        let outputs = support::outputs(&out);
        assert!(
            ["IDLE", "HANDED_OFF"].contains(&outputs["status"].as_str().unwrap_or_default()),
            "[{ctx}] {outputs}"
        );
        outputs
    }

    /// `reconcile --json` with the consumer's policy, as an operator checks.
    fn reconcile(&self, ctx: &str) -> (i32, Value) {
        let args: Vec<&str> = ["reconcile", "--json"]
            .into_iter()
            .chain(policy())
            .collect();
        let out = command(&self.live, &args).output().expect("reconcile");
        let code = expect_exit(&out, &[0, 16], ctx, "handoff reconcile");
        let report = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("[{ctx}] reconcile printed no JSON ({e}): {}", text(&out)));
        (code, report)
    }

    /// One step; returns what it did, for the log.
    fn step(&mut self, step: &Step, ctx: &str) -> String {
        match step {
            Step::Writes(writes) => {
                for write in writes {
                    self.write(write, ctx);
                }
                format!("{} writes", writes.len())
            }
            Step::Run => {
                let outputs = self.run(ctx);
                self.assert_caught_up(ctx);
                format!(
                    "run: {} handed off {}, quarantined {}, duplicates {}",
                    outputs["status"],
                    outputs["events_handed_off"],
                    outputs["events_quarantined"],
                    outputs["duplicates_suppressed"]
                )
            }
            Step::Backfill { chunk, restart } => {
                let args = backfill_args(*chunk, *restart);
                let out = command(&self.live, &strs(&args))
                    .output()
                    .expect("backfill");
                expect_exit(&out, &[0], ctx, "handoff backfill");
                let summary: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                    panic!("[{ctx}] backfill printed no JSON ({e}): {}", text(&out))
                });
                assert_eq!(summary["done"], true, "[{ctx}] {summary}");
                format!("backfill: {}", summary["this_run"])
            }
            Step::Repair => {
                let had_token = self.checkpoint_token().is_some();
                let out = command(&self.live, &strs(&repair_args()))
                    .output()
                    .expect("reconcile --repair");
                if !had_token {
                    expect_exit(
                        &out,
                        &[2],
                        ctx,
                        "reconcile --repair of a consumer without a token",
                    );
                    return "repair refused: the consumer never ran".into();
                }
                expect_exit(&out, &[0, 16], ctx, "handoff reconcile --repair");
                let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                    panic!("[{ctx}] reconcile printed no JSON ({e}): {}", text(&out))
                });
                // Reconcile again: nothing differs any more (README, "the usual sequence").
                let (code, again) = self.reconcile(ctx);
                assert!(
                    code == 0 && counts(&again) == (0, 0, 0),
                    "[{ctx}] after a repair reconcile still finds differences: {again}\nthe repair said: {report}"
                );
                format!(
                    "repair: missing/orphan/stale {:?}, held {}, repair {}; then {:?}, in flight {}",
                    counts(&report),
                    report["held_by_policy"],
                    report["repair"],
                    counts(&again),
                    again["in_flight"]["count"]
                )
            }
            Step::Reset { pick } => {
                let (Some(origin), Some(high)) = (self.origin.clone(), self.high.clone()) else {
                    panic!("[{ctx}] a reset before the consumer started");
                };
                let times: Vec<bson::Timestamp> = self
                    .history()
                    .iter()
                    .filter_map(|e| e.get_document("_id").ok())
                    .filter(|t| data(t) > origin && data(t) <= high)
                    .filter_map(cluster_time)
                    .collect();
                if times.is_empty() {
                    return "reset: the consumer passed no event yet, nothing to go back to".into();
                }
                let to = times[(*pick % times.len() as u64) as usize];
                let to = format!("{}.{}", to.time, to.increment);
                let reason = format!("model test: hand off again from {to}");
                let out = self.live.operator(&[
                    "checkpoint",
                    "reset",
                    "--to-time",
                    &to,
                    "--reason",
                    &reason,
                ]);
                expect_exit(&out, &[0], ctx, "handoff checkpoint reset");
                let token = self.checkpoint_token().expect("a token after the reset");
                let at = cluster_time(&token).expect("the token's time");
                format!(
                    "reset to just before {to} (of {} passed times): checkpoint at {}.{}",
                    times.len(),
                    at.time,
                    at.increment
                )
            }
            Step::Kill {
                target,
                after_ms,
                writes,
            } => {
                let started = Instant::now();
                let (mut child, name, codes): (Child, &str, &[i32]) = match target {
                    Target::Run => (self.live.spawn(&policy()), "run", &[0]),
                    Target::Backfill { chunk, restart } => (
                        spawn(command(&self.live, &strs(&backfill_args(*chunk, *restart)))),
                        "backfill",
                        &[0],
                    ),
                    Target::Repair => (
                        spawn(command(&self.live, &strs(&repair_args()))),
                        "repair",
                        &[0, 16],
                    ),
                };
                for write in writes {
                    self.write(write, ctx);
                }
                let deadline = Duration::from_millis(*after_ms);
                std::thread::sleep(deadline.saturating_sub(started.elapsed()));
                let outcome = match child.try_wait().expect("try_wait") {
                    Some(_) => {
                        let out = child.wait_with_output().expect("output");
                        expect_exit(&out, codes, ctx, name);
                        format!("{name} ended before its kill, exit {:?}", out.status.code())
                    }
                    None => {
                        child.kill().expect("SIGKILL");
                        child.wait().expect("reaped");
                        format!("{name} killed after {} ms", started.elapsed().as_millis())
                    }
                };
                // What the killed process sent before it died is answered before the test goes
                // on; a killed run's lease is ended, as an operator does once it is known dead
                // (README, "Lease").
                std::thread::sleep(Duration::from_millis(100));
                if matches!(target, Target::Run) {
                    self.expire_lease();
                }
                format!("{outcome}, {} writes meanwhile", writes.len())
            }
        }
    }
}

fn spawn(mut command: Command) -> Child {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn handoff")
}

/// Whether the quarantine policy hands a document off: schema version 1.
/// The schema version an update event's update description sets, if it sets one.
fn sets_version(event: &Document) -> Option<Bson> {
    event
        .get_document("updateDescription")
        .ok()?
        .get_document("updatedFields")
        .ok()?
        .get("schemaVersion")
        .cloned()
}

fn good(document: &Document) -> bool {
    matches!(
        document.get("schemaVersion"),
        Some(Bson::Int32(1)) | Some(Bson::Int64(1))
    )
}

fn counts(report: &Value) -> (u64, u64, u64) {
    let n = |kind: &str| report[kind]["count"].as_u64().unwrap_or(u64::MAX);
    (n("missing"), n("orphan"), n("stale"))
}

fn expect_exit(output: &Output, codes: &[i32], ctx: &str, what: &str) -> i32 {
    let code = output.status.code();
    assert!(
        code.is_some_and(|c| codes.contains(&c)),
        "[{ctx}] {what} exited {code:?}, expected one of {codes:?}\n{}",
        text(output)
    );
    code.unwrap_or_default()
}

#[test]
fn runs_backfills_repairs_resets_and_kills_keep_the_quarantine_policys_records_exact() {
    let seed = support::seed("HANDOFF_WRITE_PATHS_SEED");
    println!("HANDOFF_WRITE_PATHS_SEED={seed}");
    let clock = Instant::now();
    let mut rng = Rng::new(seed);
    let (initial_writes, steps, planned) = plan(&mut rng);
    println!("initial writes: {initial_writes:?}");
    for (i, step) in steps.iter().enumerate() {
        println!("plan {i}: {step:?}");
    }

    let live = Live::with_config(Config {
        history_limit: 1_000_000,
        // A killed process's open transaction is ended soon after it blocks another write.
        transaction_lifetime: Duration::from_secs(1),
        ..Config::default()
    });
    let initial = live.wait(async {
        let stream = live.coll("orders").watch().await.expect("watch");
        let token = stream.resume_token().expect("a post-batch token");
        match bson::serialize_to_bson(&token).expect("token") {
            Bson::Document(token) => token,
            other => panic!("a token {other}"),
        }
    });
    let mut harness = Harness {
        live,
        seed,
        initial,
        origin: None,
        high: None,
        writes: 0,
        model: Model::new(),
    };
    let before = format!("seed {seed} (HANDOFF_WRITE_PATHS_SEED={seed}), initial writes");
    for write in &initial_writes {
        harness.write(write, &before);
    }

    let total = steps.len();
    for (i, step) in steps.iter().enumerate() {
        let ctx = format!(
            "seed {} (HANDOFF_WRITE_PATHS_SEED={}), step {i} of {total}: {step:?}",
            harness.seed, harness.seed
        );
        let started = Instant::now();
        let did = harness.step(step, &ctx);
        harness.check(&ctx);
        println!(
            "step {i}: {did} ({} ms); outbox {}, quarantine {}",
            started.elapsed().as_millis(),
            harness.live.outbox_len(),
            harness.live.records(QUARANTINE).len()
        );
    }

    // The end: a run catches up, then everything holds and reconcile finds nothing.
    let ctx = format!("seed {seed} (HANDOFF_WRITE_PATHS_SEED={seed}), the final run");
    let outputs = harness.run(&ctx);
    println!("final run: {outputs}");
    harness.assert_caught_up(&ctx);
    harness.check(&ctx);
    let source: Model = harness
        .live
        .records("orders")
        .iter()
        .map(|d| (d.get_i32("_id").expect("an integer key"), !good(d)))
        .collect();
    assert_eq!(
        source, harness.model,
        "[{ctx}] the source is not what the test wrote"
    );
    assert_eq!(
        source, planned,
        "[{ctx}] the source is not what the plan wrote"
    );
    let ctx = format!("seed {seed} (HANDOFF_WRITE_PATHS_SEED={seed}), the final reconcile");
    let (code, report) = harness.reconcile(&ctx);
    assert!(
        code == 0 && counts(&report) == (0, 0, 0),
        "[{ctx}] INVARIANT 3: reconcile with the quarantine policy after the final run: exit {code}, {report}"
    );
    assert_eq!(report["in_flight"]["count"], 0, "[{ctx}] {report}");
    let poison = source.values().filter(|p| **p).count() as u64;
    // Every poison document differs from what the outbox says (the outbox never holds one):
    // each is held by the policy, and nothing is skipped.
    assert_eq!(
        report["held_by_policy"]["quarantined"]["count"].as_u64(),
        Some(poison),
        "[{ctx}] {report}"
    );
    assert_eq!(
        report["held_by_policy"]["skipped"]["count"], 0,
        "[{ctx}] {report}"
    );
    // Held means the quarantine holds each poison document as it is now.
    let quarantined: Vec<Document> = harness
        .live
        .records(QUARANTINE)
        .iter()
        .filter_map(|r| {
            r.get_document("event")
                .ok()?
                .get_document("fullDocument")
                .ok()
        })
        .cloned()
        .collect();
    for document in harness.live.records("orders").iter().filter(|d| !good(d)) {
        assert!(
            quarantined.contains(document),
            "[{ctx}] the quarantine lacks the poison document as it is now: {document}"
        );
    }
    println!(
        "seed {seed}: {total} steps in {:?}; outbox {}, quarantine {}, source {} documents ({poison} poison); reconcile {report}",
        clock.elapsed(),
        harness.live.outbox_len(),
        harness.live.records(QUARANTINE).len(),
        source.len()
    );
}
