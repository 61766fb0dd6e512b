//! JUnit XML as `policy test` and `policy diff` write it: one `testsuites` holding one
//! `testsuite` with its properties, a `testcase` per case, a `failure` in each that failed.

use std::io::{Cursor, Result};

use quick_xml::Writer;
use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};

/// A report being written.
pub struct Junit {
    writer: Writer<Cursor<Vec<u8>>>,
}

/// A suite's counts: tests, failures and, when measured, the time it took.
pub struct Counts<'a> {
    pub tests: usize,
    pub failures: usize,
    pub time: Option<&'a str>,
}

/// A case: its name, its class and, when measured, its time.
pub struct Case<'a> {
    pub name: &'a str,
    pub class: &'a str,
    pub time: Option<&'a str>,
}

/// Why a case failed: the failure's message, its type and its text.
pub struct Failure<'a> {
    pub message: &'a str,
    pub kind: &'a str,
    pub text: &'a str,
}

impl Junit {
    /// The declaration, the suites and the suite `name` with `properties`.
    pub fn begin(name: &str, counts: &Counts<'_>, properties: &[(&str, &str)]) -> Result<Junit> {
        let mut writer = Writer::new_with_indent(Cursor::new(Vec::new()), b' ', 2);
        writer.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
        let (tests, failures) = (counts.tests.to_string(), counts.failures.to_string());
        let mut suites = BytesStart::new("testsuites");
        suites.push_attribute(("tests", tests.as_str()));
        suites.push_attribute(("failures", failures.as_str()));
        if let Some(time) = counts.time {
            suites.push_attribute(("time", time));
        }
        writer.write_event(Event::Start(suites))?;
        let mut suite = BytesStart::new("testsuite");
        suite.push_attribute(("name", name));
        suite.push_attribute(("tests", tests.as_str()));
        suite.push_attribute(("failures", failures.as_str()));
        suite.push_attribute(("errors", "0"));
        if let Some(time) = counts.time {
            suite.push_attribute(("time", time));
        }
        writer.write_event(Event::Start(suite))?;
        writer.write_event(Event::Start(BytesStart::new("properties")))?;
        for (key, value) in properties {
            let mut property = BytesStart::new("property");
            property.push_attribute(("name", *key));
            property.push_attribute(("value", *value));
            writer.write_event(Event::Empty(property))?;
        }
        writer.write_event(Event::End(BytesEnd::new("properties")))?;
        Ok(Junit { writer })
    }

    /// A case, passed (no failure) or failed.
    pub fn case(&mut self, case: &Case<'_>, failure: Option<&Failure<'_>>) -> Result<()> {
        let mut element = BytesStart::new("testcase");
        element.push_attribute(("name", case.name));
        element.push_attribute(("classname", case.class));
        if let Some(time) = case.time {
            element.push_attribute(("time", time));
        }
        let Some(failure) = failure else {
            self.writer.write_event(Event::Empty(element))?;
            return Ok(());
        };
        self.writer.write_event(Event::Start(element))?;
        let mut start = BytesStart::new("failure");
        start.push_attribute(("message", failure.message));
        start.push_attribute(("type", failure.kind));
        self.writer.write_event(Event::Start(start))?;
        self.writer
            .write_event(Event::Text(BytesText::new(failure.text)))?;
        self.writer
            .write_event(Event::End(BytesEnd::new("failure")))?;
        self.writer
            .write_event(Event::End(BytesEnd::new("testcase")))
    }

    /// The report, ended, as text with a final newline.
    pub fn finish(mut self) -> Result<String> {
        self.writer
            .write_event(Event::End(BytesEnd::new("testsuite")))?;
        self.writer
            .write_event(Event::End(BytesEnd::new("testsuites")))?;
        let mut text = String::from_utf8(self.writer.into_inner().into_inner())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        text.push('\n');
        Ok(text)
    }
}
