use super::*;

#[test]
fn a_reason_is_printable_text_that_reads_as_written() {
    assert_eq!(
        reason_text("--reason", "  history lost, INC-42 é ").unwrap(),
        "history lost, INC-42 é"
    );
    for hidden in [
        "a\u{202e}b",
        "a\u{2066}b\u{2069}",
        "a\u{200b}b",
        "a\u{200f}b",
        "a\u{feff}b",
        "a\u{2060}b",
        "a\u{2028}b",
        "a\u{2029}b",
        "a\u{85}b",
        "a\u{1b}[2Kb",
        "a\nb",
        "a\tb",
    ] {
        let error = reason_text("--reason", hidden).unwrap_err().to_string();
        assert!(
            error.starts_with("--reason holds the character U+"),
            "{error}"
        );
        // The message names the character; it does not carry it.
        assert!(
            !error.chars().any(handoff::domain::text::needs_escape),
            "{error:?}"
        );
    }
    for empty_or_long in [" ", &"x".repeat(MAX_REASON + 1)] {
        assert!(reason_text("--reason", empty_or_long).is_err());
    }
}
