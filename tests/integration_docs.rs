//! The documentation as a reader meets it: every Markdown file of the repository renders its
//! tables and resolves its relative links, the README's quick starts run as written against the
//! test server and print what the README says they print, and every `handoff …` command line of
//! a shell block is accepted by `handoff`'s argument parser.

use crate::support;

use std::collections::BTreeSet;
use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the workspace folder")
}

/// Every Markdown file of the repository, outside build output, installed packages, virtual
/// environments and hidden folders (caches, version control).
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read a folder").flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let kind = entry.file_type().expect("a file type");
            if kind.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "node_modules") {
                    walk(&path, found);
                }
            } else if name.ends_with(".md") {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(&root(), &mut found);
    found.sort();
    for expected in [
        "README.md",
        "tests/README.md",
        "host/benches/README.md",
        "flows/README.md",
    ] {
        assert!(
            found.contains(&root().join(expected)),
            "{expected} not found among {found:?}"
        );
    }
    found
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The options GitHub renders with that matter here: CommonMark with GFM tables.
fn parser(text: &str) -> Parser<'_> {
    Parser::new_ext(
        text,
        Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS,
    )
}

/// A heading's anchor as GitHub derives it: lower case, letters, digits, `-` and `_` kept,
/// spaces turned into `-`, everything else dropped; a repeated anchor gets `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in parser(text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let title = heading.take().unwrap_or_default();
                let slug: String = title
                    .to_lowercase()
                    .chars()
                    .filter_map(|c| match c {
                        ' ' => Some('-'),
                        c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                        _ => None,
                    })
                    .collect();
                let mut candidate = slug.clone();
                let mut n = 0;
                while found.contains(&candidate) {
                    n += 1;
                    candidate = format!("{slug}-{n}");
                }
                found.insert(candidate);
            }
            _ => {}
        }
    }
    found
}

/// A line that a reader takes for a table row: `| … |`.
fn looks_like_a_row(line: &str) -> bool {
    let line = line.trim();
    line.len() > 2 && line.starts_with('|') && line.ends_with('|')
}

#[test]
fn every_table_row_renders_inside_a_table() {
    let mut broken = Vec::new();
    let mut tables = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).expect("read a Markdown file");
        // Byte ranges rendered as tables, and those that are code or HTML (not prose).
        let mut inside = Vec::new();
        let mut verbatim = Vec::new();
        for (event, range) in parser(&text).into_offset_iter() {
            match event {
                Event::Start(Tag::Table(_)) => {
                    tables += 1;
                    inside.push(range);
                }
                Event::Start(Tag::CodeBlock(_)) | Event::Start(Tag::HtmlBlock) => {
                    verbatim.push(range)
                }
                _ => {}
            }
        }
        let mut offset = 0;
        for (number, line) in text.split_inclusive('\n').enumerate() {
            let at = offset;
            offset += line.len();
            if !looks_like_a_row(line) || verbatim.iter().any(|r| r.contains(&at)) {
                continue;
            }
            if !inside.iter().any(|r| r.contains(&at)) {
                broken.push(format!(
                    "{}:{}: {}",
                    relative(&file),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(tables >= 10, "only {tables} tables rendered");
    assert!(
        broken.is_empty(),
        "lines that look like table rows but render outside a table (a separator row with a \
         cell too many or too few breaks its table):\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_relative_link_points_at_a_file_and_heading_that_exist() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).expect("read a Markdown file");
        for event in parser(&text) {
            let destination = match event {
                Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => dest_url,
                _ => continue,
            };
            if destination.contains("://") || destination.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match destination.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (destination.as_ref(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !target.exists() {
                broken.push(format!("{}: {destination}: no such file", relative(&file)));
                continue;
            }
            if let Some(anchor) = anchor {
                let target_text = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&target_text).contains(anchor) {
                    broken.push(format!(
                        "{}: {destination}: no heading with that anchor",
                        relative(&file)
                    ));
                }
            }
        }
    }
    assert!(checked >= 30, "only {checked} relative links checked");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The anchors the checks above derive are GitHub's.
#[test]
fn anchors_are_derived_as_github_derives_them() {
    let text = "# What a policy's WASI imports get\n## Shaping the stream (`run`)\n## A\n## A\n";
    assert_eq!(
        anchors(text),
        BTreeSet::from(
            [
                "what-a-policys-wasi-imports-get",
                "shaping-the-stream-run",
                "a",
                "a-1"
            ]
            .map(String::from)
        )
    );
    // A separator row with a cell too many is no table.
    let broken = "| a | b |\n|---|---|---|\n| 1 | 2 |\n";
    assert!(
        !parser(broken).any(|e| matches!(e, Event::Start(Tag::Table(_)))),
        "a table with a mismatched separator row rendered"
    );
    assert!(
        parser("| a | b |\n|---|---|\n| 1 | 2 |\n")
            .any(|e| matches!(e, Event::Start(Tag::Table(_))))
    );
}

/// The README's recovery sequence after lost history is written once, in the operators' part, in
/// the order `handoff` gives everywhere.
#[test]
fn the_recovery_sequence_is_written_once_and_in_the_order_handoff_gives() {
    let needle = "The usual sequence after lost history";
    let mut places = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for _ in text.matches(needle) {
            places.push(relative(&file));
        }
    }
    assert_eq!(places, ["README.md"], "{needle:?}");
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let operators = readme
        .split("\n## For operators\n")
        .nth(1)
        .expect("the README has a section for operators");
    let operators = operators.split("\n## ").next().unwrap();
    assert!(operators.contains(needle));
    // It gives the order `handoff` gives (the failed run's `next_commands`, `--help`), and so do
    // the exit code tables and the engine examples' alerts.
    let paragraph = &operators[operators.find(needle).unwrap()..];
    let paragraph = paragraph.split("\n\n").next().unwrap();
    support::assert_recovery_order(paragraph, "the README's recovery sequence");
    let row = readme
        .lines()
        .find(|l| l.starts_with("| 6 |"))
        .expect("the exit code table's row 6");
    support::assert_recovery_order(row, "the README's exit code 6");
    let flows = std::fs::read_to_string(root().join("flows/README.md")).unwrap();
    let after = &flows[flows
        .find("After history lost (6)")
        .expect("flows/README.md")..];
    support::assert_recovery_order(after.split("\n\n").next().unwrap(), "flows/README.md");
    for flow in [
        "flows/docker/mongodb-change-stream-resume-token-recovery.yml",
        "flows/process/mongodb-change-stream-resume-token-recovery.yml",
    ] {
        let text = std::fs::read_to_string(root().join(flow)).unwrap();
        let alert = &text[text.find("alert_recovery_failed").expect(flow)..];
        support::assert_recovery_order(alert, flow);
    }
}

/// The fenced code blocks of a Markdown text: their info string and contents.
fn code_blocks(text: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(String, String)> = None;
    for event in parser(text) {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) => {
                current = Some((info.to_string(), String::new()))
            }
            Event::Text(t) => {
                if let Some((_, body)) = current.as_mut() {
                    body.push_str(&t);
                }
            }
            Event::End(TagEnd::CodeBlock) => blocks.extend(current.take()),
            _ => {}
        }
    }
    blocks
}

/// The fenced block right after the line `marker` in the README.
fn marked_block(readme: &str, marker: &str) -> String {
    let after = readme
        .split_once(&format!("{marker}\n"))
        .unwrap_or_else(|| panic!("the README has no {marker}"))
        .1;
    assert!(
        after.starts_with("```"),
        "{marker} is not right before a code block"
    );
    let (_, body) = code_blocks(after).into_iter().next().expect("a code block");
    body
}

/// The folder `handoff` was built in: `mongo-sim` is built there too (`cargo build -p mongo-sim`
/// with the cargo running this test: a moment when it is up to date).
fn commands_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_handoff"))
        .parent()
        .unwrap()
        .to_path_buf();
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args(["build", "--locked", "-p", "mongo-sim", "--bin", "mongo-sim"])
        .current_dir(root());
    if dir.ends_with("release") {
        cargo.arg("--release");
    }
    let output = cargo.output().expect("run cargo");
    assert!(
        output.status.success(),
        "cargo build -p mongo-sim: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(dir.join("mongo-sim").exists(), "{}", dir.display());
    dir
}

/// A TCP port no one listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `sh` running `script` in `dir` with `path` as its PATH and none of `handoff`'s variables set,
/// in a process group of its own, which is ended once `sh` exits or after `limit`: what the
/// script left running (a server in the background) ends with it. Returns the exit code (none
/// after the limit), stdout and stderr.
fn sh(script: &str, dir: &Path, path: &str, limit: Duration) -> (Option<i32>, String, String) {
    // The environment `handoff` gets in every suite: none of its variables, the shared cache.
    let mut sh = Command::new("sh");
    for (key, value) in support::handoff().get_envs() {
        match value {
            Some(value) => sh.env(key, value),
            None => sh.env_remove(key),
        };
    }
    let stdout_file = dir.join(".stdout");
    let stderr_file = dir.join(".stderr");
    let mut child = sh
        .arg("-c")
        .arg(script)
        .env("PATH", path)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_file).unwrap())
        .stderr(std::fs::File::create(&stderr_file).unwrap())
        .process_group(0)
        .spawn()
        .expect("run sh");
    let group = child.id() as i32;
    let deadline = Instant::now() + limit;
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait for sh") {
            break status.code();
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // SAFETY: a signal to the process group this test started; nothing else is in it.
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
    let _ = child.wait();
    let read = |file: &Path| {
        let mut text = String::new();
        std::fs::File::open(file)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text
    };
    (code, read(&stdout_file), read(&stderr_file))
}

/// Whether `line` reads as `expected`, where `…` stands for any text.
fn reads_as(line: &str, expected: &str) -> bool {
    let mut parts = expected.split('…');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// Each quick start of the README (a block after `<!-- quickstart: NAME -->`), run as written
/// with `sh` against the test server (`handoff` and `mongo-sim` first on the PATH, the port of
/// the README replaced by a free one), prints the lines of the block after
/// `<!-- quickstart-output: NAME -->`, in order, and no failure.
#[test]
fn the_quick_starts_run_as_written() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let names: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("<!-- quickstart: "))
        .map(|l| l.trim_end_matches(" -->"))
        .collect();
    assert_eq!(names, ["user", "operator", "recovery"]);
    let dir = commands_dir();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for name in names {
        let port = free_port().to_string();
        let script = marked_block(&readme, &format!("<!-- quickstart: {name} -->"));
        let expected = marked_block(&readme, &format!("<!-- quickstart-output: {name} -->"));
        assert!(script.contains("27018"), "{name}: the README's port");
        let script = script.replace("27018", &port);
        let expected = expected.replace("27018", &port);
        let scratch = tempfile::tempdir().unwrap();
        let (code, stdout, stderr) = sh(&script, scratch.path(), &path, Duration::from_secs(180));
        let context = format!("quick start {name}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        assert_eq!(code, Some(0), "{context}");
        // The recovery quick start shows one run failing for lost history, and nothing else.
        let expected_failures = if name == "recovery" {
            "error[history_lost]"
        } else {
            "\0"
        };
        assert_eq!(
            stderr.matches("error[").count(),
            stderr.matches(expected_failures).count(),
            "{context}"
        );
        if name == "recovery" {
            assert_eq!(stderr.matches(expected_failures).count(), 1, "{context}");
        }
        let mut lines = stdout.lines();
        for wanted in expected.lines().filter(|l| l.trim() != "…") {
            assert!(
                lines.any(|line| reads_as(line, wanted)),
                "{context}\nno line reads as (in order): {wanted}"
            );
        }
    }
}

#[test]
fn reads_as_matches_elided_text() {
    assert!(reads_as(
        "outbox  1 records, last at 12:00",
        "outbox  1 records, …"
    ));
    assert!(reads_as("a x b y c", "a…b…c"));
    assert!(reads_as("abc", "abc"));
    assert!(!reads_as("abcd", "abc"));
    assert!(!reads_as("a x c", "a…b…c"));
    assert!(!reads_as("outbox  2 records", "outbox  1 records…"));
}

/// The words of a shell line and the commands it runs: comments dropped, split at `&&`, `||`,
/// `;`, `|` and `&` outside quotes.
fn shell_commands(line: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current = String::new();
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    let mut previous = ' ';
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                quote = None;
                current.push(c);
            }
            (Some(_), c) => current.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                current.push(c);
            }
            (None, '#') if previous.is_whitespace() => break,
            (None, ';' | '|' | '&') => {
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                commands.push(std::mem::take(&mut current));
            }
            (None, c) => current.push(c),
        }
        previous = c;
    }
    commands.push(current);
    commands
        .into_iter()
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect()
}

/// Whether a shell command runs `handoff` (after variable assignments and `do` / `then`).
fn runs_handoff(command: &str) -> bool {
    command
        .split_whitespace()
        .find(|w| !(w.contains('=') || ["do", "then", "else", "exec"].contains(w)))
        == Some("handoff")
}

#[test]
fn shell_lines_are_split_into_commands() {
    assert_eq!(
        shell_commands("handoff policy new p --lang rust|python   # comment"),
        ["handoff policy new p --lang rust", "python"]
    );
    assert_eq!(
        shell_commands(
            "for i in 0 1; do CONSUMER_ID=o-$i handoff run --partition $i/4 & done; wait"
        ),
        [
            "for i in 0 1",
            "do CONSUMER_ID=o-$i handoff run --partition $i/4",
            "done",
            "wait"
        ]
    );
    assert_eq!(
        shell_commands("a 'x; y' && b \"#1\""),
        ["a 'x; y'", "b \"#1\""]
    );
    assert!(runs_handoff("do CONSUMER_ID=o-$i handoff run"));
    assert!(runs_handoff("HANDOFF_INVALIDATE_MARKER=true handoff run"));
    assert!(!runs_handoff("mongo-sim --port 1"));
}

/// Every `handoff …` command of a shell block in the documentation is accepted by the argument
/// parser: run in a scratch folder against a URI no server answers (or the one the line sets),
/// it may fail, but not with the parser's usage error. A renamed flag or command fails here.
#[test]
fn every_documented_handoff_command_line_parses() {
    let mut lines = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (info, body) in code_blocks(&text) {
            if !["sh", "bash", "shell", "console"].contains(&info.trim()) {
                continue;
            }
            let joined = body.replace("\\\n", " ");
            for line in joined.lines() {
                for command in shell_commands(line) {
                    if runs_handoff(&command) {
                        lines.push((relative(&file), command));
                    }
                }
            }
        }
    }
    assert!(
        lines.len() >= 25,
        "only {} command lines: {lines:?}",
        lines.len()
    );
    let handoff_dir = Path::new(env!("CARGO_BIN_EXE_handoff")).parent().unwrap();
    let path = format!(
        "{}:{}",
        handoff_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let scratch = tempfile::tempdir().unwrap();
    // The check tells a renamed flag or command from any other failure.
    lines.push((
        "(a renamed flag)".into(),
        "handoff run --no-such-flag".into(),
    ));
    lines.push((
        "(a renamed command)".into(),
        "handoff no-such-command".into(),
    ));
    // Each line in a scratch folder of its own, eight at a time (most wait on a connection).
    let check = |(file, command): &(String, String)| {
        // A loop's variable (`$i`) is set; a URI the line does not set answers nowhere.
        let script = format!(
            "i=0; MONGODB_URI='mongodb://127.0.0.1:9/?replicaSet=rs0&serverSelectionTimeoutMS=200'; export MONGODB_URI; {command}"
        );
        let folder = tempfile::tempdir_in(scratch.path()).unwrap();
        let (_, _, stderr) = sh(&script, folder.path(), &path, Duration::from_secs(10));
        // The parser's refusals end with its usage line and a pointer to `--help`.
        let usage_error = stderr.contains("For more information, try '--help'")
            || stderr.lines().any(|l| l.starts_with("Usage: handoff"));
        usage_error.then(|| format!("{file}: {command}\n{stderr}"))
    };
    let mut refused = Vec::new();
    for chunk in lines.chunks(8) {
        std::thread::scope(|scope| {
            let checks: Vec<_> = chunk
                .iter()
                .map(|line| scope.spawn(move || check(line)))
                .collect();
            refused.extend(checks.into_iter().filter_map(|c| c.join().unwrap()));
        });
    }
    let (controls, refused): (Vec<String>, Vec<String>) = refused
        .into_iter()
        .partition(|r| r.starts_with("(a renamed"));
    assert_eq!(controls.len(), 2, "the parser's refusals went unnoticed");
    assert!(
        refused.is_empty(),
        "documented command lines handoff's parser refuses:\n{}",
        refused.join("\n")
    );
}

/// Headings used by the suites that read the README stay where they look for them.
#[test]
fn the_sections_the_suites_read_exist() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let headings: Vec<(HeadingLevel, String)> = {
        let mut found = Vec::new();
        let mut current: Option<(HeadingLevel, String)> = None;
        for event in parser(&readme) {
            match event {
                Event::Start(Tag::Heading { level, .. }) => current = Some((level, String::new())),
                Event::Text(t) | Event::Code(t) => {
                    if let Some((_, h)) = current.as_mut() {
                        h.push_str(&t);
                    }
                }
                Event::End(TagEnd::Heading(_)) => found.extend(current.take()),
                _ => {}
            }
        }
        found
    };
    for (level, title) in [
        (HeadingLevel::H2, "Set-up on a fresh machine"),
        (HeadingLevel::H3, "Exit codes"),
        (HeadingLevel::H3, "Least privilege"),
        (HeadingLevel::H4, "run"),
        (HeadingLevel::H4, "checkpoint reset"),
        (HeadingLevel::H4, "backfill"),
        (HeadingLevel::H4, "reconcile --repair"),
    ] {
        assert!(
            headings.iter().any(|(l, t)| *l == level && t == title),
            "the README has no {level:?} heading {title:?}"
        );
    }
    // The set-up commands are the README's first two code blocks.
    let blocks = code_blocks(&readme);
    assert!(
        blocks[0]
            .1
            .starts_with("rustup toolchain install && cargo run --release -p handoff -- replay")
    );
    assert_eq!(blocks[1].1, "./tests/run\n");
}
