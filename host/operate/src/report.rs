//! Self-contained HTML reports (`--html FILE`): charts, figures and differences readable
//! offline, no script, no external resource.

mod axis;
pub mod chart;

use std::path::Path;

use quick_xml::escape::escape;

use handoff_domain::error::{HandoffError, Result};
use handoff_domain::text::escape_chars;

pub use chart::{Chart, Forecast, RunPoint, history_charts};

/// A report: a title, charts (inline SVG), then sections of labelled rows.
pub struct Page {
    pub title: String,
    pub charts: Vec<Chart>,
    pub sections: Vec<Section>,
}

pub struct Section {
    pub heading: String,
    pub rows: Vec<(String, String)>,
}

impl Page {
    pub fn to_html(&self) -> String {
        let mut html = String::from(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width\">",
        );
        html.push_str(&format!("<title>{}</title>", text(&self.title)));
        html.push_str(
            "<style>body{font-family:system-ui,sans-serif;margin:2em;color:#222}\
             table{border-collapse:collapse;margin-bottom:2em}\
             th,td{border:1px solid #ccc;padding:.3em .8em;text-align:left;vertical-align:top}\
             th{background:#f4f4f4}td{font-family:ui-monospace,monospace}\
             h1,h2,td{overflow-wrap:anywhere}.warn{color:#a00;font-weight:bold}\
             .chart{margin:0 0 1.5em}.chart svg{display:block;width:100%;max-width:960px;height:auto}\
             @media (max-width:600px){body{margin:.8em}}</style></head><body>",
        );
        html.push_str(&format!("<h1>{}</h1>", text(&self.title)));
        html.push_str(&format!(
            "<p>Generated {} by handoff {}.</p>",
            escape(
                bson::DateTime::now()
                    .try_to_rfc3339_string()
                    .unwrap_or_default()
                    .as_str()
            ),
            env!("CARGO_PKG_VERSION")
        ));
        for chart in &self.charts {
            html.push_str(&chart.to_html());
        }
        for section in &self.sections {
            html.push_str(&format!("<h2>{}</h2><table>", text(&section.heading)));
            for (label, value) in &section.rows {
                let class = if label.eq_ignore_ascii_case("warning") {
                    " class=\"warn\""
                } else {
                    ""
                };
                html.push_str(&format!(
                    "<tr><th>{}</th><td{class}>{}</td></tr>",
                    text(label),
                    text(value)
                ));
            }
            html.push_str("</table>");
        }
        html.push_str("</body></html>\n");
        html
    }

    /// Checks that a report can be written to `path`, before the command reads or writes
    /// anything: `path` names a file (not a directory) in an existing directory this process may
    /// create files in (a temporary file is made there and removed).
    pub fn check_path(path: &Path) -> Result<()> {
        let refused = |why: String| {
            HandoffError::BadInput(format!(
                "--html {}: {why}; nothing was read or written",
                path.display()
            ))
        };
        if path.file_name().is_none() || path.is_dir() {
            return Err(refused("it is a directory, not a file".into()));
        }
        let folder = folder_of(path);
        if !folder.is_dir() {
            return Err(refused(format!(
                "its directory {} does not exist",
                folder.display()
            )));
        }
        tempfile::NamedTempFile::new_in(folder)
            .map(drop)
            .map_err(|e| refused(format!("its directory cannot be written to ({e})")))
    }

    /// Writes the report to `path`, atomically (a temporary file renamed into place).
    pub fn write(&self, path: &Path) -> Result<()> {
        let folder = folder_of(path);
        let failed = |e: std::io::Error| {
            HandoffError::BadInput(format!(
                "the report {} cannot be written: {e}",
                path.display()
            ))
        };
        let mut file = tempfile::NamedTempFile::new_in(folder).map_err(failed)?;
        std::io::Write::write_all(&mut file, self.to_html().as_bytes()).map_err(failed)?;
        file.persist(path).map_err(|e| failed(e.error))?;
        Ok(())
    }
}

/// The directory a file path is in (`.` for a bare file name).
fn folder_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Text as one HTML-escaped line: characters that could reorder or hide text escaped as
/// `\u{…}` first (names and values may come from the server).
fn text(text: &str) -> String {
    escape(escape_chars(text).as_str()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_and_nothing_is_fetched() {
        let report = Page {
            title: "status <c>".into(),
            charts: Vec::new(),
            sections: vec![Section {
                heading: "figures".into(),
                rows: vec![
                    ("lag".into(), "<script>alert(1)</script>".into()),
                    ("WARNING".into(), "gone & lost".into()),
                ],
            }],
        };
        let html = report.to_html();
        assert!(!html.contains("<script>"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("gone &amp; lost"));
        assert!(html.contains("<title>status &lt;c&gt;</title>"));
        for external in ["src=", "href=", "http://", "https://", "@import"] {
            assert!(!html.contains(external), "{external}");
        }
        let dir = tempfile::tempdir().expect("a temporary folder");
        let path = dir.path().join("r.html");
        report.write(&path).expect("written");
        let written = std::fs::read_to_string(&path).expect("read");
        assert!(written.starts_with("<!DOCTYPE html>") && written.ends_with("</html>\n"));
        assert!(written.contains("gone &amp; lost"));
    }

    #[test]
    fn names_from_the_server_cannot_reorder_or_break_the_page() {
        let report = Page {
            title: "status rs0\u{202e}lanif".into(),
            charts: Vec::new(),
            sections: vec![Section {
                heading: "db.orders\u{2028}x".into(),
                rows: vec![("set\u{200b}name".into(), "a\nb\u{2066}c".into())],
            }],
        };
        let html = report.to_html();
        for hidden in ['\u{202e}', '\u{2028}', '\u{200b}', '\u{2066}'] {
            assert!(!html.contains(hidden), "{hidden:?}");
        }
        assert!(html.contains("status rs0\\u{202e}lanif"), "{html}");
        assert!(html.contains("<td>a\\nb\\u{2066}c</td>"), "{html}");
    }

    #[test]
    fn a_report_path_is_checked_before_anything_is_done() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let error = |path: &Path| Page::check_path(path).unwrap_err().to_string();
        assert!(error(dir.path()).contains("is a directory"));
        let missing = dir.path().join("gone").join("r.html");
        assert!(
            error(&missing).contains("does not exist"),
            "{}",
            error(&missing)
        );
        assert!(error(&missing).ends_with("nothing was read or written"));
        let path = dir.path().join("r.html");
        Page::check_path(&path).expect("a writable folder");
        // The check leaves nothing behind.
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 0);
    }
}
