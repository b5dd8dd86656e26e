//! The logfmt encoding every line on stdout shares.
//!
//! Owns how one key/value pair is written so that any standard logfmt decoder
//! (go-logfmt's rules) reads each value back unchanged: a value is bare when it
//! can be, otherwise quoted with `\"`, `\\`, `\n`, `\r`, `\t` and `\u00XX` for
//! the other control characters. It does not decide what is logged or where the
//! bytes go: `events` writes the signal lines, `telemetry` the diagnostics.

use std::fmt::Write;

/// Appends ` key=value`, without the space when it starts a line (`buf` may
/// hold earlier lines, each ended by `\n`).
///
/// Keys are compile-time identifiers in this crate, so only values are escaped.
pub fn push_pair(line: &mut String, key: &str, value: &str) {
    if !(line.is_empty() || line.ends_with('\n')) {
        line.push(' ');
    }
    line.push_str(key);
    line.push('=');
    push_value(line, value);
}

/// Appends ` key=<integer>` without allocating (a drain writes three
/// integers per line, a million lines a backlog).
pub fn push_int_pair(line: &mut String, key: &str, value: i64) {
    if !(line.is_empty() || line.ends_with('\n')) {
        line.push(' ');
    }
    line.push_str(key);
    line.push('=');
    line.push_str(itoa::Buffer::new().format(value));
}

/// Appends one value, quoting and escaping it only when a decoder needs that.
pub fn push_value(line: &mut String, value: &str) {
    if !needs_quotes(value) {
        line.push_str(value);
        return;
    }
    line.push('"');
    for c in value.chars() {
        match c {
            '"' => line.push_str("\\\""),
            '\\' => line.push_str("\\\\"),
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            '\t' => line.push_str("\\t"),
            // Other C0 controls and DEL: a terminal or a line-based shipper
            // must never see them raw.
            c if c < ' ' || c == '\u{7f}' => {
                let _ = write!(line, "\\u{:04x}", c as u32);
            }
            // U+2028/U+2029 are line breaks to JavaScript-based tooling; keep
            // one event on one visual line everywhere.
            '\u{2028}' | '\u{2029}' => {
                let _ = write!(line, "\\u{:04x}", c as u32);
            }
            c => line.push(c),
        }
    }
    line.push('"');
}

/// The bytes a value is scanned for first (`needs_quotes`): every character
/// that needs quoting is ASCII except U+2028/U+2029, whose UTF-8 encoding
/// starts with 0xE2. A table, because this scan was a quarter of the daemon's
/// own work in a drain (each byte of every key and owner of a million lines):
/// one load a byte instead of six comparisons.
const SUSPICIOUS: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b <= b' ' as usize {
        table[b] = true;
        b += 1;
    }
    table[b'=' as usize] = true;
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table[0x7f] = true;
    table[0xe2] = true;
    table
};

/// go-logfmt quotes a value that is empty or holds a space, `=`, `"`, a
/// control character or anything a bare value cannot carry; so do we.
fn needs_quotes(value: &str) -> bool {
    if !value.is_empty() && !value.bytes().any(|b| SUSPICIOUS[usize::from(b)]) {
        return false;
    }
    value.is_empty()
        || value.chars().any(|c| {
            c <= ' '
                || c == '='
                || c == '"'
                || c == '\\'
                || c == '\u{7f}'
                || c == '\u{2028}'
                || c == '\u{2029}'
        })
}

/// Decodes one logfmt line into its pairs, in order.
///
/// The daemon never reads logfmt; this exists so the tests share one
/// reference decoder that follows go-logfmt (including `\uXXXX` escapes). Returns `None` on a malformed line.
pub fn decode_line(line: &str) -> Option<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek() == Some(&' ') {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(pairs);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ' ' {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() {
            return None;
        }
        if chars.peek() != Some(&'=') {
            pairs.push((key, String::new()));
            continue;
        }
        chars.next();
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => match chars.next()? {
                        '"' => value.push('"'),
                        '\\' => value.push('\\'),
                        '/' => value.push('/'),
                        'n' => value.push('\n'),
                        'r' => value.push('\r'),
                        't' => value.push('\t'),
                        'b' => value.push('\u{8}'),
                        'f' => value.push('\u{c}'),
                        'u' => {
                            let hex: String = (0..4).filter_map(|_| chars.next()).collect();
                            let code = u32::from_str_radix(&hex, 16).ok()?;
                            value.push(char::from_u32(code)?);
                        }
                        _ => return None,
                    },
                    c if c < ' ' => return None,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ' ' {
                    break;
                }
                if c == '"' || c == '=' {
                    return None;
                }
                value.push(c);
                chars.next();
            }
        }
        pairs.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(value: &str) -> String {
        let mut line = String::new();
        push_pair(&mut line, "k", value);
        assert!(
            !line.contains('\n') && !line.contains('\r'),
            "raw line break in {line:?}"
        );
        let pairs = decode_line(&line).unwrap_or_else(|| panic!("undecodable: {line}"));
        assert_eq!(pairs.len(), 1, "{line}");
        pairs[0].1.clone()
    }

    #[test]
    fn plain_values_stay_bare() {
        let mut line = String::new();
        push_pair(&mut line, "lockKey", "payout:acct-1");
        push_pair(&mut line, "token", "42");
        assert_eq!(line, "lockKey=payout:acct-1 token=42");
    }

    #[test]
    fn hostile_values_read_back_unchanged() {
        for v in [
            "",
            "a b",
            "a=b",
            "say \"hi\"",
            "back\\slash",
            "line\nbreak",
            "cr\rlf",
            "tab\there",
            "esc\u{1b}[31mred",
            "nul\u{0}byte",
            "del\u{7f}",
            "sep\u{2028}para\u{2029}",
            "ünïcødé ✓ 鍵",
            "forged level=error message=lease_expired",
        ] {
            assert_eq!(round_trip(v), v);
        }
        let long = "k\n\"=".repeat(512);
        assert_eq!(round_trip(&long), long);
    }

    /// The byte table agrees with the character rule on every ASCII
    /// character, alone and inside a value, and on the two separators.
    #[test]
    fn byte_scan_quotes_exactly_what_the_rule_quotes() {
        for c in (0u8..=0x7f)
            .map(char::from)
            .chain(['\u{2028}', '\u{2029}', 'â', '✓'])
        {
            let rule =
                c <= ' ' || matches!(c, '=' | '"' | '\\' | '\u{7f}' | '\u{2028}' | '\u{2029}');
            for v in [c.to_string(), format!("a{c}b")] {
                assert_eq!(needs_quotes(&v), rule, "{v:?}");
                assert_eq!(round_trip(&v), v);
            }
        }
    }

    #[test]
    fn integers_are_written_in_full() {
        let mut line = String::new();
        for v in [0, -1, 42, i64::MIN, i64::MAX] {
            push_int_pair(&mut line, "n", v);
        }
        assert_eq!(
            line,
            "n=0 n=-1 n=42 n=-9223372036854775808 n=9223372036854775807"
        );
    }

    #[test]
    fn control_characters_use_go_style_unicode_escapes() {
        let mut line = String::new();
        push_value(&mut line, "a\u{1b}b");
        assert_eq!(line, "\"a\\u001bb\"");
    }
}
