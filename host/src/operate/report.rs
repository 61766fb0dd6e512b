//! Self-contained HTML reports (`--html FILE`): figures and differences readable offline, no
//! script, no external resource.

use std::path::Path;

use quick_xml::escape::escape;

use crate::error::{HandoffError, Result};

/// A report: a title, then sections of labelled rows.
pub struct Report {
    pub title: String,
    pub sections: Vec<Section>,
}

pub struct Section {
    pub heading: String,
    pub rows: Vec<(String, String)>,
}

impl Report {
    pub fn to_html(&self) -> String {
        let mut html = String::from(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width\">",
        );
        html.push_str(&format!("<title>{}</title>", escape(self.title.as_str())));
        html.push_str(
            "<style>body{font-family:system-ui,sans-serif;margin:2em;color:#222}\
             table{border-collapse:collapse;margin-bottom:2em}\
             th,td{border:1px solid #ccc;padding:.3em .8em;text-align:left;vertical-align:top}\
             th{background:#f4f4f4}td{font-family:ui-monospace,monospace}\
             .warn{color:#a00;font-weight:bold}</style></head><body>",
        );
        html.push_str(&format!("<h1>{}</h1>", escape(self.title.as_str())));
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
        for section in &self.sections {
            html.push_str(&format!(
                "<h2>{}</h2><table>",
                escape(section.heading.as_str())
            ));
            for (label, value) in &section.rows {
                let class = if label.eq_ignore_ascii_case("warning") {
                    " class=\"warn\""
                } else {
                    ""
                };
                html.push_str(&format!(
                    "<tr><th>{}</th><td{class}>{}</td></tr>",
                    escape(label.as_str()),
                    escape(value.as_str())
                ));
            }
            html.push_str("</table>");
        }
        html.push_str("</body></html>\n");
        html
    }

    /// Writes the report to `path`, atomically (a temporary file renamed into place).
    pub fn write(&self, path: &Path) -> Result<()> {
        let folder = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_and_nothing_is_fetched() {
        let report = Report {
            title: "status <c>".into(),
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
}
