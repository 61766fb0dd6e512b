//! Untrusted text made safe to print.
//!
//! A policy's error string, log message and fields, and skip or quarantine reasons, and a server's
//! error message, all reach stdout or stderr, where the workflow engine reads every line that
//! starts with `::` as a protocol line (Kestra reads stderr too). Such text is printed only after
//! [`escape_untrusted`]: control and line-breaking characters escaped, raw resume tokens replaced,
//! length bounded. Validated names (a consumer ID) go through [`escape_name`], which never takes
//! them for tokens. Only the host ever starts a line.

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
    let mut out = escape_chars(&kept);
    if cut {
        out.push_str(ELLIPSIS);
    }
    out
}

/// `text` with every character of [`needs_escape`] written as `\u{…}` (`\n`, `\r`, `\t` as
/// themselves escaped), nothing else changed and nothing cut.
pub fn escape_chars(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Characters that could end a line, move the cursor, reorder text or hide in a terminal:
/// control characters, line and paragraph separators, zero-width characters and bidirectional
/// marks, embeddings, overrides and isolates.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' // line and paragraph separators
                | '\u{061c}' // Arabic letter mark (bidirectional)
                | '\u{180e}' // Mongolian vowel separator (zero-width)
                | '\u{200b}'..='\u{200f}' // zero-width and direction marks
                | '\u{202a}'..='\u{202e}' // bidirectional embeddings and overrides
                | '\u{2060}'..='\u{2064}' // word joiner and invisible operators
                | '\u{2066}'..='\u{2069}' // bidirectional isolates
                | '\u{feff}' // byte-order mark
        )
}

/// The fewest hex digits taken for a resume token's `_data`: MongoDB's is KeyString hex that
/// begins with the timestamp's type byte `82` and its 8 bytes (18 digits), followed by at least
/// the token's version and kind (a high-water mark's, the shortest, is 30 digits).
const MIN_TOKEN_DIGITS: usize = 24;

/// Replaces what holds a raw resume token, so that a printed line never carries one: a run of
/// uppercase hex digits in which `82` is followed by at least [`MIN_TOKEN_DIGITS`] digits in all
/// (the run is replaced whole, whatever is glued to either end of the token). Anything else is
/// printed as it is: a name such as a consumer ID (it starts with a letter, so a token in it
/// needs `82` after the start and 22 more digits), a long number, or the digits of a lowercase
/// hex digest such as an event ID.
pub fn scrub_tokens(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if holds_token(run) {
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

/// Whether a run of uppercase hex digits holds a token's `_data`: `82` with at least
/// [`MIN_TOKEN_DIGITS`] digits from it to the run's end.
fn holds_token(run: &str) -> bool {
    run.len() >= MIN_TOKEN_DIGITS
        && run
            .match_indices("82")
            .any(|(at, _)| run.len() - at >= MIN_TOKEN_DIGITS)
}

/// A name (a consumer ID, a collection) as one printable line. A name of letters, digits,
/// underscores and hyphens (every valid one) is printed as it was given, at most `max_chars` of
/// it, and never taken for a token; anything else is untrusted text ([`escape_untrusted`]).
pub fn escape_name(name: &str, max_chars: usize) -> String {
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return escape_untrusted(name, max_chars);
    }
    let mut kept: String = name.chars().take(max_chars).collect();
    if kept.len() < name.len() {
        kept.push_str(ELLIPSIS);
    }
    kept
}

/// The names of `known` close to `name` (a typo of one of them), closest first: what a refusal
/// of an unknown name suggests.
pub fn near_names<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let wanted = name.to_lowercase();
    let mut near: Vec<(f64, &str)> = known
        .into_iter()
        .filter(|k| *k != name)
        .map(|k| (strsim::jaro_winkler(&wanted, &k.to_lowercase()), k))
        .filter(|(score, _)| *score >= 0.85)
        .collect();
    near.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    near.into_iter().map(|(_, k)| k).take(3).collect()
}

/// What a refusal of the unknown `name` adds about the `known` names `place` holds: the near
/// ones, else up to ten of them, else that it holds none.
pub fn known_names_hint(name: &str, known: &[String], place: &str) -> String {
    match did_you_mean(name, known.iter().map(String::as_str)) {
        hint if !hint.is_empty() => hint,
        _ if known.is_empty() => format!("; {place} holds no consumer"),
        _ => format!(
            "; {place} holds {}",
            known
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `"; did you mean a or b?"` for the names near `name`, or `""`.
pub fn did_you_mean<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    let near = near_names(name, known);
    if near.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", near.join(" or "))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn near_names_are_the_typos_closest_first() {
        let known = [
            "orders-to-outbox",
            "orders-to-search",
            "billing",
            "change_demo",
        ];
        assert_eq!(
            near_names("orders-to-outbx", known),
            ["orders-to-outbox", "orders-to-search"]
        );
        assert_eq!(near_names("chnage_demo", known), ["change_demo"]);
        assert!(near_names("zzz", known).is_empty());
        assert!(
            near_names("billing", known).is_empty(),
            "the name itself is not near"
        );
        assert_eq!(did_you_mean("biling", known), "; did you mean billing?");
        assert_eq!(did_you_mean("zzz", known), "");
    }
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
    fn consumer_ids_are_never_taken_for_tokens() {
        // Valid consumer IDs made of uppercase hex digits, and one with a token's prefix.
        for id in [
            "DEADBEEF00000000A",
            "ABCDEF0123456789ABCDEF0123456789ABCDEF",
            "C8263515EAC000000022B02",
        ] {
            assert_eq!(scrub_tokens(id), id);
            assert_eq!(escape_untrusted(id, 64), id);
            assert_eq!(escape_name(id, 64), id);
        }
        // A name is never scrubbed, whatever it holds; its control characters are still escaped.
        let named = "C8263515EAC000000022B0229296E04";
        assert_eq!(escape_name(named, 64), named);
        assert_eq!(escape_name("a\nb", 64), "a\\nb");
        assert_eq!(
            escape_name("bad name 8263515EAC000000022B0229296E04", 64),
            "bad name <token>"
        );
        assert_eq!(escape_name("abcdef", 3), "abc…");
    }

    #[test]
    fn every_real_token_shape_is_replaced() {
        // The resume tokens of real MongoDB servers in the event-ID vectors.
        let vectors: serde_json::Value = serde_json::from_str(include_str!(
            "../../../tests/fixtures/event-id-vectors.json"
        ))
        .expect("vectors");
        let mut seen = 0;
        for vector in vectors.as_array().expect("a list") {
            let Some(text) = vector["token_canonical_extjson"].as_str() else {
                continue;
            };
            let token: serde_json::Value = serde_json::from_str(text).expect("token JSON");
            let Some(data) = token["_data"].as_str() else {
                continue;
            };
            seen += 1;
            assert!(!scrub_tokens(text).contains(data), "{text}");
            assert_eq!(scrub_tokens(data), "<token>");
        }
        assert!(seen >= 3, "the vectors hold tokens");
        // The test server's: an event's, a fragment's, and one of decimal digits only.
        for data in [
            "8263515EAC0000000201000000000000",
            "8263515EAC00000002010000000000000000000002",
            "826351599000000002010000000000",
        ] {
            assert_eq!(scrub_tokens(data), "<token>", "{data}");
        }
        // Glued to hex digits at either end, or between letters that are not hex.
        let data = "8263515EAC000000022B0229296E04";
        for glued in [
            format!("DEADBEEF{data}"),
            format!("{data}A"),
            format!("7{data}F"),
        ] {
            assert_eq!(scrub_tokens(&glued), "<token>", "{glued}");
        }
        assert_eq!(scrub_tokens(&format!("x{data}y")), "x<token>y");
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
