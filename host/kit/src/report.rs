//! What `policy test` reports: each case's verdict, for people (diffs on a terminal), as one JSON
//! document, or as JUnit XML for CI systems.

use crate::junit::{Case as JunitCase, Counts, Failure, Junit};
use serde_json::{Value, json};

use handoff_domain::error::{HandoffError, Result};

/// How a case ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Passed,
    /// The results differ from the expectations (or there are none yet).
    Failed {
        diff: String,
        had_expectations: bool,
    },
    /// The results differed and were written as the new expectations.
    Updated {
        diff: String,
    },
    /// The results differed and the update was declined: nothing written.
    Declined {
        diff: String,
    },
}

impl Verdict {
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Passed | Verdict::Updated { .. })
    }

    fn name(&self) -> &'static str {
        match self {
            Verdict::Passed => "passed",
            Verdict::Failed { .. } => "failed",
            Verdict::Updated { .. } => "updated",
            Verdict::Declined { .. } => "declined",
        }
    }

    fn diff(&self) -> Option<&str> {
        match self {
            Verdict::Passed => None,
            Verdict::Failed { diff, .. }
            | Verdict::Updated { diff }
            | Verdict::Declined { diff } => Some(diff),
        }
    }

    /// Why a case failed, in one line.
    fn message(&self) -> String {
        match self {
            Verdict::Failed {
                had_expectations: false,
                ..
            } => "no expectations yet: run with --update".into(),
            Verdict::Declined { .. } => "the results differ; the update was declined".into(),
            _ => "the results differ from the expectations".into(),
        }
    }
}

/// One case's result.
#[derive(Clone, Debug)]
pub struct CaseResult {
    pub name: String,
    pub verdict: Verdict,
    pub seconds: f64,
}

/// A whole `policy test` run.
#[derive(Clone, Debug)]
pub struct TestSummary {
    pub policy: String,
    pub policy_sha256: String,
    pub cases: Vec<CaseResult>,
}

impl TestSummary {
    pub fn failed(&self) -> usize {
        self.cases.iter().filter(|c| !c.verdict.passed()).count()
    }

    pub fn passed(&self) -> usize {
        self.cases.len() - self.failed()
    }

    /// One JSON document: the policy, each case (name, verdict, diff, seconds) and the counts.
    pub fn json(&self) -> Value {
        json!({
            "policy": self.policy,
            "policy_sha256": self.policy_sha256,
            "passed": self.passed(),
            "failed": self.failed(),
            "cases": self.cases.iter().map(|case| json!({
                "name": case.name,
                "verdict": case.verdict.name(),
                "diff": case.verdict.diff(),
                "seconds": case.seconds,
            })).collect::<Vec<_>>(),
        })
    }

    /// JUnit XML: one `testsuite` named after the policy, one `testcase` per case, a `failure`
    /// holding the diff for each case that did not pass.
    pub fn junit(&self) -> Result<String> {
        self.write_junit()
            .map_err(|e| HandoffError::Internal(e.into()))
    }

    fn write_junit(&self) -> std::io::Result<String> {
        let total: f64 = self.cases.iter().map(|c| c.seconds).sum();
        let time = format!("{total:.3}");
        let suite_name = format!("handoff policy {}", self.policy);
        let mut junit = Junit::begin(
            &suite_name,
            &Counts {
                tests: self.cases.len(),
                failures: self.failed(),
                time: Some(&time),
            },
            &[("policy_sha256", &self.policy_sha256)],
        )?;
        for case in &self.cases {
            let seconds = format!("{:.3}", case.seconds);
            let message = case.verdict.message();
            let failure = (!case.verdict.passed()).then(|| Failure {
                message: &message,
                kind: case.verdict.name(),
                text: case.verdict.diff().unwrap_or_default(),
            });
            junit.case(
                &JunitCase {
                    name: &case.name,
                    class: &suite_name,
                    time: Some(&seconds),
                },
                failure.as_ref(),
            )?;
        }
        junit.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> TestSummary {
        TestSummary {
            policy: "p.wasm".into(),
            policy_sha256: "ab".repeat(32),
            cases: vec![
                CaseResult {
                    name: "fine".into(),
                    verdict: Verdict::Passed,
                    seconds: 0.25,
                },
                CaseResult {
                    name: "broken <&> \"quoted\"".into(),
                    verdict: Verdict::Failed {
                        diff: "- \"a\" ]]> <b>\n+ c & d\n".into(),
                        had_expectations: true,
                    },
                    seconds: 0.5,
                },
            ],
        }
    }

    #[test]
    fn json_has_every_case_and_the_counts() {
        let value = summary().json();
        assert_eq!(value["passed"], 1);
        assert_eq!(value["failed"], 1);
        assert_eq!(value["cases"][0]["verdict"], "passed");
        assert_eq!(value["cases"][0]["diff"], Value::Null);
        assert_eq!(value["cases"][1]["verdict"], "failed");
        assert!(
            value["cases"][1]["diff"]
                .as_str()
                .unwrap()
                .contains("+ c & d")
        );
    }

    #[test]
    fn junit_is_well_formed_and_keeps_the_diff_verbatim() {
        let xml = summary().junit().unwrap();
        assert!(
            xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"),
            "{xml}"
        );
        // Read it back with the same crate: names and the diff survive escaping exactly.
        use quick_xml::events::Event;
        let mut reader = quick_xml::Reader::from_str(&xml);
        let (mut names, mut text, mut failures) = (Vec::new(), String::new(), 0);
        loop {
            match reader.read_event().unwrap() {
                Event::Start(e) | Event::Empty(e) if e.name().as_ref() == b"testcase" => {
                    let name = e.try_get_attribute("name").unwrap().unwrap();
                    names.push(name.unescape_value().unwrap().into_owned());
                }
                Event::Start(e) if e.name().as_ref() == b"failure" => failures += 1,
                Event::Text(t) => text.push_str(&t.decode().unwrap()),
                Event::GeneralRef(r) => {
                    let name = r.decode().unwrap();
                    text.push_str(match name.as_ref() {
                        "lt" => "<",
                        "gt" => ">",
                        "amp" => "&",
                        "quot" => "\"",
                        "apos" => "'",
                        other => panic!("unexpected entity {other}"),
                    });
                }
                Event::Eof => break,
                _ => {}
            }
        }
        assert_eq!(names, vec!["fine", "broken <&> \"quoted\""]);
        assert_eq!(failures, 1);
        assert!(text.contains("- \"a\" ]]> <b>\n+ c & d"), "{text:?}");
        assert!(xml.contains("tests=\"2\" failures=\"1\""), "{xml}");
    }
}
