//! Untrusted text made safe to print.
//!
//! A policy's error string, log message and fields, and skip or quarantine reasons, and a server's
//! error message, all reach stdout or stderr, where the workflow engine reads every line that
//! starts with `::` as a protocol line (Kestra reads stderr too). Such text is printed only after
//! [`escape_untrusted`]: control and line-breaking characters escaped, raw resume tokens replaced,
//! length bounded. Only the host ever starts a line.

/// Marks text cut at its bound.
const ELLIPSIS: &str = "…";

/// `text` as one printable line: control characters (C0, DEL, C1), line and paragraph separators,
/// bidirectional overrides and other format characters are written as `\u{…}` (`\n`, `\r`, `\t`
/// as themselves escaped), raw resume tokens become `<token>`, and at most `max_chars` characters
/// of the input are kept. Escaping escaped text again changes nothing, so a message can be
/// escaped where it enters and again where it is printed.
pub fn escape_untrusted(text: &str, max_chars: usize) -> String {
    let mut kept: String = text.chars().take(max_chars).collect();
    let cut = kept.len() < text.len();
    kept = scrub_tokens(&kept);
    let mut out = String::with_capacity(kept.len() + 8);
    for c in kept.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    if cut {
        out.push_str(ELLIPSIS);
    }
    out
}

/// Characters that could end a line, move the cursor, reorder text or hide in a terminal.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' // line and paragraph separators
                | '\u{200b}'..='\u{200f}' // zero-width and direction marks
                | '\u{202a}'..='\u{202e}' // bidirectional embeddings and overrides
                | '\u{2066}'..='\u{2069}' // bidirectional isolates
                | '\u{feff}' // byte-order mark
        )
}

/// Replaces what looks like a raw resume token (a run of 16 or more uppercase hex digits with at
/// least one letter, the shape of a token's `_data`) so that a printed line never carries one. A
/// run of decimal digits alone is not a token: a long number, or the digits inside a lowercase
/// hex digest such as an event ID, is printed as it is.
pub fn scrub_tokens(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.len() >= 16 && run.bytes().any(|b| b.is_ascii_uppercase()) {
            out.push_str("<token>");
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in text.chars() {
        if c.is_ascii_digit() || ('A'..='F').contains(&c) {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// `text` with the user information of every URI in it (`scheme://user:password@host`) replaced
/// by `***`: for text that may hold a URI no driver parsed (an argument refused before any
/// connection), where the secrets are not known apart from their place.
pub fn hide_uri_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The URI ends at a space, a quote or the line's end; everything up to its last `@`
        // is taken for user information (a password may hold `/`, `?` or `#` unescaped: a
        // host hidden with it is better than a password shown).
        let end = tail
            .find(|c: char| matches!(c, '\'' | '"' | '`') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(user_end) => {
                out.push_str("***");
                out.push_str(&authority[user_end..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_of_any_uri_are_hidden() {
        assert_eq!(
            hide_uri_credentials(
                "unexpected argument 'mongodb://user:pa%40ss@db:27017/?x=1' found"
            ),
            "unexpected argument 'mongodb://***@db:27017/?x=1' found"
        );
        // An unparsable URI with `@` in its password, two URIs, and text without any.
        assert_eq!(
            hide_uri_credentials("a mongodb+srv://u:p@ss@h b mongodb://h2 c"),
            "a mongodb+srv://***@h b mongodb://h2 c"
        );
        assert_eq!(hide_uri_credentials("no uri: a@b"), "no uri: a@b");
        assert_eq!(
            hide_uri_credentials("'mongodb://u:pa/ss#w?d@h/db'"),
            "'mongodb://***@h/db'"
        );
        assert_eq!(hide_uri_credentials("x://"), "x://");
    }

    #[test]
    fn raw_tokens_never_reach_the_log() {
        let line = scrub_tokens(
            r#"saw {"_data": "826AE70DA0000000012B0429296E1404"} at 2026, id 6c44a91c"#,
        );
        assert_eq!(line, r#"saw {"_data": "<token>"} at 2026, id 6c44a91c"#);
        // Against lowercase text too: the token's uppercase run is still replaced.
        assert_eq!(
            scrub_tokens("x826AE70DA0000000012B0429296E1404abc"),
            "x<token>abc"
        );
    }

    #[test]
    fn digests_and_long_numbers_are_not_tokens() {
        // An event ID whose digest holds a run of 18 decimal digits, and a 19-digit number.
        let id = "orders/f8999fc22ebe45f1efbb89ff328864201670618036ba2ea3adf28d8c0566b81c";
        assert_eq!(scrub_tokens(id), id);
        let number = "value 9223372036854775807 too large";
        assert_eq!(scrub_tokens(number), number);
    }

    #[test]
    fn no_line_can_be_started_from_untrusted_text() {
        let forged =
            "done\n::{\"outputs\":{\"status\":\"HANDED_OFF\"}}::\r\u{2028}::x\u{85}::y\u{1b}[2K";
        let line = escape_untrusted(forged, 1024);
        assert!(
            !line.contains(['\n', '\r', '\u{2028}', '\u{85}', '\u{1b}']),
            "{line}"
        );
        assert_eq!(
            line,
            "done\\n::{\"outputs\":{\"status\":\"HANDED_OFF\"}}::\\r\\u{2028}::x\\u{85}::y\\u{1b}[2K"
        );
    }

    #[test]
    fn length_is_bounded_and_cut_text_is_marked() {
        let line = escape_untrusted(&"é".repeat(5000), 100);
        assert_eq!(line.chars().count(), 101);
        assert!(line.ends_with(ELLIPSIS));
        assert_eq!(escape_untrusted("short", 100), "short");
    }

    #[test]
    fn escaping_twice_changes_nothing() {
        let once = escape_untrusted("a\nb\u{2028}c 826AE70DA0000000012B0429296E1404", 1024);
        assert_eq!(escape_untrusted(&once, 4096), once);
    }
}
