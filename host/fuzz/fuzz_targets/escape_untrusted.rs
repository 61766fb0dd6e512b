//! The escaping of policy-controlled text before it is printed: the output is one line with no
//! control, line-breaking or separator character, and depends only on the first `max` characters
//! of the input (an ellipsis marks a cut).
#![no_main]

use handoff_domain::text::escape_untrusted;
use libfuzzer_sys::fuzz_target;

const ELLIPSIS: &str = "\u{2026}";

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let max = usize::from(first);
    let text = String::from_utf8_lossy(rest);
    let out = escape_untrusted(&text, max);
    for c in out.chars() {
        assert!(
            !c.is_control() && !matches!(c, '\u{2028}' | '\u{2029}' | '\u{85}'),
            "{c:?} in {out:?}"
        );
    }
    let kept: String = text.chars().take(max).collect();
    let cut = text.chars().count() > max;
    let mut expected = escape_untrusted(&kept, max);
    assert!(
        !expected.ends_with(ELLIPSIS) || kept.ends_with(ELLIPSIS),
        "{expected:?}"
    );
    if cut {
        expected.push_str(ELLIPSIS);
    }
    assert_eq!(out, expected, "{text:?} cut to {max}");
    // Each kept character prints as at most `\u{10ffff}` (10 characters).
    assert!(out.chars().count() <= 10 * max + 1, "{out:?}");
});
