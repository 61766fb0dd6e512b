//! A policy with a parameter, run natively over the fake host:
//! `cargo run -p handoff-policy-sdk --example skip_drafts`.
//!
//! Orders whose `fullDocument.status` is the `skip` parameter (default `draft`) are skipped,
//! orders without a status are quarantined, everything else is handed off, two events per
//! transaction. In a policy crate (a `cdylib`), `handoff_policy_sdk::export_policy!(SkipDrafts);`
//! under `#[cfg(target_arch = "wasm32")]` makes it the component.

use handoff_policy_sdk::fake::FakeHost;
use handoff_policy_sdk::{Decision, Delivered, FromSettings, Level, Policy, Report, Settings};

struct SkipDrafts {
    /// The status to skip, as the Extended JSON text of a string.
    skip: String,
    skipped: u32,
}

impl FromSettings for SkipDrafts {
    fn from_settings(settings: &Settings) -> Result<SkipDrafts, String> {
        let skip = settings.param("skip").unwrap_or("draft");
        if skip.is_empty() || skip.contains('"') {
            return Err(format!("skip must be a plain status, not {skip:?}"));
        }
        Ok(SkipDrafts {
            skip: format!("\"{skip}\""),
            skipped: 0,
        })
    }
}

impl Policy for SkipDrafts {
    const PARAMETERS: &'static [(&'static str, &'static str)] = &[(
        "skip",
        "the status whose documents are not handed off (default draft)",
    )];

    fn decide(&mut self, event: &mut Delivered<'_>, id: String) -> Decision {
        if event.operation_type == "delete" {
            return Decision::HandOff(id);
        }
        match event.field("fullDocument.status") {
            Some(status) if status == self.skip => {
                self.skipped += 1;
                Decision::Skip(format!("status {status}"))
            }
            Some(_) => Decision::HandOff(id),
            None => Decision::Quarantine {
                id,
                reason: "the order has no status".into(),
            },
        }
    }

    fn batch_size(&self) -> usize {
        2
    }

    fn finish(
        &mut self,
        host: &mut dyn handoff_policy_sdk::Host,
        report: &Report,
    ) -> Result<(), String> {
        let skipped = self.skipped.to_string();
        host.log(Level::Info, "run finished", &[("skipped", &skipped)]);
        let _ = report;
        Ok(())
    }
}

fn main() {
    let mut host = FakeHost::new()
        .event("T1", "insert")
        .field("T1", "fullDocument.status", "\"paid\"")
        .event("T2", "insert")
        .field("T2", "fullDocument.status", "\"draft\"")
        .event("T3", "update")
        .event("T4", "delete")
        .watermark("W");
    let settings = Settings::new(50, 3000);
    match handoff_policy_sdk::run::<SkipDrafts>(&mut host, &settings) {
        Ok(report) => println!("{report:?}"),
        Err(error) => {
            eprintln!("the run failed: {error}");
            std::process::exit(1);
        }
    }
    for commit in &host.commits {
        println!(
            "commit up to {} ({:?}): {:?}",
            commit.next, commit.mode, commit.decisions
        );
    }
    println!("checkpoint: {:?}; logs: {:?}", host.token(), host.logs);
}
