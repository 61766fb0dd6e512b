//! Arguments the parser refused, reported as one would any other line: a value given on the
//! command line or in the environment is untrusted text (it may hold a line break that starts a
//! protocol line, or a URI with its password), so the parser's message is printed only after
//! every such value in it is escaped and every credential removed.

use crate::cli::env;
use clap::error::ContextValue;
use handoff::backend::mongo::Redactor;
use handoff::domain::text::{escape_untrusted, hide_uri_credentials};

/// The longest value kept whole in the message.
const MAX_VALUE_CHARS: usize = 512;
/// The longest line of the message.
const MAX_LINE_CHARS: usize = 4096;

/// The parser's message for `error`, safe to print: the values it quotes escaped, credentials
/// of any URI removed, each line bounded.
pub fn message(error: &clap::Error) -> String {
    let mut text = error.render().to_string();
    // The values the message may quote: those the parser names, and every argument given.
    let mut values: Vec<String> = Vec::new();
    for (_, value) in error.context() {
        match value {
            ContextValue::String(s) => values.push(s.clone()),
            ContextValue::Strings(list) => values.extend(list.iter().cloned()),
            ContextValue::StyledStr(s) => values.push(s.to_string()),
            _ => {}
        }
    }
    values.extend(
        std::env::args_os()
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned()),
    );
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    values.dedup();
    for value in &values {
        let escaped = escape_untrusted(value, MAX_VALUE_CHARS);
        if !value.is_empty() && escaped != *value {
            text = text.replace(value.as_str(), &escaped);
        }
    }
    // Credentials: as the driver parses them where a value is a URI it accepts, then the user
    // information of whatever else looks like a URI.
    let uris = values
        .iter()
        .cloned()
        .chain(std::env::var(env::MONGODB_URI).ok())
        .filter(|v| v.contains("://"));
    for uri in uris {
        if let Some(redactor) = Redactor::for_uri(&uri) {
            text = redactor.clean(&text);
        }
    }
    let text = hide_uri_credentials(&text);
    text.trim_end()
        .lines()
        .map(|line| escape_untrusted(line, MAX_LINE_CHARS))
        .collect::<Vec<_>>()
        .join("\n")
}
