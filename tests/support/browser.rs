//! An HTML report as a person sees it: rendered by headless Chromium (Debian's `chromium`; the
//! test command installs it), checked on the rendered page, and kept as a screenshot.
//!
//! The report has no script, so the checks run beside it: a page holding two frames, each with a
//! copy of the report (`srcdoc`), one 1280 px wide and one 400 px wide (narrower than any
//! headless window can be), and a script that measures both once they are laid out and writes
//! its findings into the page; `chromium --dump-dom` prints that page.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The widths the report is checked at, in CSS pixels.
pub const WIDE: u32 = 1280;
pub const NARROW: u32 = 400;

/// How long one browser process may take before the check fails.
const BROWSER_LIMIT: Duration = Duration::from_secs(60);

/// Renders the report `html` in headless Chromium and checks the rendered page, at 1280 px and
/// at 400 px: each of `texts` is visible, at least `min_charts` SVG charts are drawn with a size
/// and plotted marks, nothing is wider than the page (no element past its edges, no horizontal
/// scrolling), and the page has no script and fetches or refers to nothing outside itself. Saves a screenshot of the page
/// at 1280 px as `target/test-artifacts/reports/<file stem>.png` and returns its path.
pub fn check_report(html: &Path, texts: &[&str], min_charts: usize) -> PathBuf {
    let chromium = chromium();
    let page = std::fs::read_to_string(html)
        .unwrap_or_else(|e| panic!("the report {} cannot be read: {e}", html.display()));
    let name = html
        .file_stem()
        .expect("the report is a file")
        .to_string_lossy()
        .into_owned();
    let work = tempfile::tempdir().expect("a temporary folder");
    let harness = work.path().join("check.html");
    std::fs::write(&harness, harness_page(&page, texts)).expect("write the checking page");
    let dom = run(
        &chromium,
        &work,
        "check",
        &[WIDE + NARROW + 100, 1000],
        &[
            "--virtual-time-budget=5000".into(),
            "--dump-dom".into(),
            harness.display().to_string(),
        ],
    );
    let found = findings(&dom);

    // The screenshot: the report itself (a copy in a folder of ours), as tall as its page.
    let height = found["wide"]["height"]
        .as_u64()
        .unwrap_or(800)
        .clamp(600, 12_000) as u32;
    let copy = work.path().join("report.html");
    std::fs::write(&copy, &page).expect("copy the report");
    let folder = artifacts();
    let png = folder.join(format!("{name}.png"));
    let _ = std::fs::remove_file(&png);
    run(
        &chromium,
        &work,
        "screenshot",
        &[WIDE, height],
        &[
            "--hide-scrollbars".into(),
            format!("--screenshot={}", png.display()),
            copy.display().to_string(),
        ],
    );
    let image =
        std::fs::read(&png).unwrap_or_else(|e| panic!("no screenshot {}: {e}", png.display()));
    assert!(
        image.len() > 1_000 && image.starts_with(b"\x89PNG\r\n\x1a\n"),
        "the screenshot {} is not a PNG image ({} bytes)",
        png.display(),
        image.len()
    );
    let png_width = u32::from_be_bytes(image[16..20].try_into().expect("IHDR width"));
    assert_eq!(png_width, WIDE, "the screenshot's width");

    let mut problems = Vec::new();
    for (frame, width) in [("wide", WIDE), ("narrow", NARROW)] {
        problems.extend(
            problems_at(&found[frame], width, texts, min_charts)
                .into_iter()
                .map(|p| format!("at {width} px: {p}")),
        );
    }
    assert!(
        problems.is_empty(),
        "the report {} as rendered (screenshot {}):\n  {}",
        html.display(),
        png.display(),
        problems.join("\n  ")
    );
    png
}

/// What is wrong with the page laid out in a frame `width` pixels wide.
fn problems_at(found: &Value, width: u32, texts: &[&str], min_charts: usize) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(error) = found.get("error") {
        return vec![format!("the checking script failed: {error}")];
    }
    let number = |key: &str| found[key].as_f64().unwrap_or(f64::NAN);
    if number("innerWidth") != f64::from(width) {
        problems.push(format!("the frame is {} px wide", number("innerWidth")));
    }
    // A width that is not a number fails too.
    let fits = number("scrollWidth").partial_cmp(&number("clientWidth"));
    if !matches!(
        fits,
        Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
    ) {
        problems.push(format!(
            "the page scrolls sideways: {} px of content in {} px",
            number("scrollWidth"),
            number("clientWidth")
        ));
    }
    for wide in found["wide"].as_array().into_iter().flatten() {
        problems.push(format!("wider than the page: {wide}"));
    }
    for text in texts {
        if found["texts"][*text] != Value::Bool(true) {
            problems.push(format!("{text:?} is not visible"));
        }
    }
    let charts = found["charts"].as_array().cloned().unwrap_or_default();
    let drawn = charts
        .iter()
        .filter(|c| {
            c["width"].as_f64().unwrap_or(0.0) > 0.0
                && c["height"].as_f64().unwrap_or(0.0) > 0.0
                && c["marks"].as_u64().unwrap_or(0) > 0
        })
        .count();
    if drawn < min_charts {
        problems.push(format!(
            "{drawn} charts drawn with plotted marks, fewer than {min_charts}: {charts:?}"
        ));
    }
    if found["scripts"] != 0 {
        problems.push(format!("the report has {} scripts", found["scripts"]));
    }
    if found["resources"].as_array().is_none_or(|r| !r.is_empty()) {
        problems.push(format!(
            "the report fetches or refers to {}",
            found["resources"]
        ));
    }
    problems
}

/// The checking page: the report twice, in frames of the two widths, and the script that
/// measures them once everything is loaded.
fn harness_page(report: &str, texts: &[&str]) -> String {
    let copy = report
        .replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    // `<` escaped in the JSON: no text can end the script.
    let texts = serde_json::to_string(texts)
        .expect("texts as JSON")
        .replace('<', "\\u003c");
    format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body style=\"margin:0\">\
         <iframe id=\"wide\" style=\"border:0;width:{WIDE}px;height:800px\" srcdoc=\"{copy}\"></iframe>\
         <iframe id=\"narrow\" style=\"border:0;width:{NARROW}px;height:800px\" srcdoc=\"{copy}\"></iframe>\
         <pre id=\"findings\"></pre><script>const TEXTS = {texts};\n{CHECKS}</script></body></html>"
    )
}

/// Measures each frame's document; writes the findings as hex-encoded JSON (nothing in them
/// needs escaping in the dumped page).
const CHECKS: &str = r#"
function describe(el) {
  return el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
    (el.getAttribute('class') ? '.' + el.getAttribute('class') : '');
}
function visible(doc, text) {
  const walker = doc.createTreeWalker(doc.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.data.replace(/\s+/g, ' ').includes(text)) continue;
    const style = getComputedStyle(node.parentElement);
    if (style.visibility !== 'visible' || style.display === 'none' || style.opacity === '0') continue;
    const range = doc.createRange();
    range.selectNodeContents(node);
    for (const r of range.getClientRects()) if (r.width > 0 && r.height > 0) return true;
  }
  return false;
}
function measure(frame) {
  const doc = frame.contentDocument, win = frame.contentWindow, root = doc.documentElement;
  const width = root.clientWidth;
  const found = {
    innerWidth: win.innerWidth, clientWidth: width, scrollWidth: root.scrollWidth,
    height: root.scrollHeight, scripts: doc.scripts.length,
    resources: win.performance.getEntriesByType('resource').map(e => e.name),
    wide: [], texts: {}, charts: [],
  };
  // What the page refers to outside itself: fetched or not, a self-contained page has none.
  for (const el of doc.querySelectorAll(
      '[src],[href],[srcset],[data],[style*="url("],link,object,embed,iframe,frame,base'))
    found.resources.push(el.outerHTML.slice(0, 120));
  for (const sheet of doc.styleSheets)
    for (const rule of sheet.cssRules)
      if (/url\(|@import/.test(rule.cssText)) found.resources.push(rule.cssText.slice(0, 120));
  for (const el of doc.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.right > width + 0.5 || r.left < -0.5)
      found.wide.push(describe(el) + ' from ' + Math.round(r.left) + ' to ' + Math.round(r.right) + ' px');
  }
  for (const text of TEXTS) found.texts[text] = visible(doc, text);
  for (const svg of doc.querySelectorAll('svg')) {
    const box = svg.getBoundingClientRect();
    const view = (svg.getAttribute('viewBox') || '').split(/\s+/).map(Number);
    let marks = 0;
    for (const mark of svg.querySelectorAll('polyline,path,polygon,circle,rect')) {
      const b = mark.getBoundingClientRect();
      if (b.width === 0 && b.height === 0) continue;
      // The drawing's background is no mark.
      if (mark.tagName === 'rect' && Number(mark.getAttribute('width')) >= view[2] &&
          Number(mark.getAttribute('height')) >= view[3]) continue;
      marks++;
    }
    found.charts.push({ width: box.width, height: box.height, marks: marks });
  }
  return found;
}
window.addEventListener('load', () => {
  let findings;
  try {
    findings = { wide: measure(document.getElementById('wide')),
                 narrow: measure(document.getElementById('narrow')) };
  } catch (e) {
    findings = { wide: { error: String(e) }, narrow: { error: String(e) } };
  }
  const bytes = new TextEncoder().encode(JSON.stringify(findings));
  document.getElementById('findings').textContent =
    Array.from(bytes, b => b.toString(16).padStart(2, '0')).join('');
});
"#;

/// The findings the checking script wrote into the dumped page.
fn findings(dom: &str) -> Value {
    let hex = dom
        .split_once("<pre id=\"findings\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .map(|(hex, _)| hex.trim())
        .filter(|hex| !hex.is_empty())
        .unwrap_or_else(|| {
            panic!(
                "the checking script wrote nothing; the page as rendered:\n{}",
                dom.chars().take(2_000).collect::<String>()
            )
        });
    let bytes = hex::decode(hex).expect("the findings are hex");
    serde_json::from_slice(&bytes).expect("the findings are JSON")
}

/// Runs headless Chromium with a fresh profile in `work`, its window `size` wide and high, and
/// returns what it printed; fails the test when it fails or takes longer than a minute (its
/// whole process group is ended).
fn run(
    chromium: &Path,
    work: &tempfile::TempDir,
    what: &str,
    size: &[u32; 2],
    args: &[String],
) -> String {
    use std::os::unix::process::CommandExt;
    let profile = work.path().join(format!("profile-{what}"));
    let stdout = work.path().join(format!("{what}.stdout"));
    let stderr = work.path().join(format!("{what}.stderr"));
    let mut command = Command::new(chromium);
    command.args([
        "--headless",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        // Nothing the page names could be reached, were it to name anything.
        "--host-resolver-rules=MAP * ~NOTFOUND",
    ]);
    if rustix::process::geteuid().is_root() {
        command.arg("--no-sandbox");
    }
    command
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--window-size={},{}", size[0], size[1]))
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("browser output file"))
        .stderr(std::fs::File::create(&stderr).expect("browser error file"))
        .process_group(0);
    let mut child = command.spawn().expect("start chromium");
    let group = rustix::process::Pid::from_child(&child);
    let deadline = Instant::now() + BROWSER_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The browser's helpers (renderer, GPU, zygote) are in its process group.
    let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    let _ = child.wait();
    let read = |path: &Path| {
        String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
    };
    let errors = read(&stderr);
    match status {
        Some(status) if status.success() => read(&stdout),
        Some(status) => panic!("chromium ({what}) failed with {status}:\n{errors}"),
        None => panic!(
            "chromium ({what}) did not finish within {} s:\n{errors}",
            BROWSER_LIMIT.as_secs()
        ),
    }
}

/// Debian's `chromium` on the `PATH`; the test fails, saying how to install it, without it.
fn chromium() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|folder| folder.join("chromium"))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "chromium is not installed: the HTML reports are checked in it. Install Debian's \
                 package (`apt-get install chromium`; tests/run installs it)"
            )
        })
}

/// `target/test-artifacts/reports`, made when missing.
fn artifacts() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target folder");
    let folder = target.join("test-artifacts").join("reports");
    std::fs::create_dir_all(&folder).expect("the artifacts folder");
    folder
}
