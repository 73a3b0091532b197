//! A peer's words as the trainer prints them: every string that came from the other
//! end of a connection (a `failed` reason, a node's name, a batch key, a dict name,
//! a dtype) is shown through [`Bounded`] wherever it reaches a log line, an error,
//! a summary or a label. At most [`MAX_PEER_TEXT`] bytes of it are shown, cut on a
//! character boundary; control characters and other characters that do not print
//! are escaped (`\n`, `\u{1b}`; bytes that are not UTF-8 as `\x{ff}`), the escapes
//! counting toward the limit; a cut string ends with ` … (N bytes)`, `N` its whole
//! size. So a 64 MiB reason prints as at most [`MAX_PRINTED`] bytes, and a short
//! printable one prints as itself.

use std::fmt;

/// Most bytes of a peer's string shown (escapes included), before the suffix.
pub const MAX_PEER_TEXT: usize = 256;

/// Most bytes [`Bounded`] prints: [`MAX_PEER_TEXT`] and the longest suffix
/// (` … (18446744073709551615 bytes)`, 33 bytes).
pub const MAX_PRINTED: usize = MAX_PEER_TEXT + 33;

/// A peer's string as it is printed: at most [`MAX_PEER_TEXT`] bytes, escaped, with
/// ` … (N bytes)` when cut (see the [module](self)).
#[derive(Clone, Copy, Debug)]
pub struct Bounded<'a>(pub &'a str);

impl fmt::Display for Bounded<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_bounded(f, self.0.chars().map(Unit::Char), self.0.len())
    }
}

/// Bytes from a peer that should be text (a name read before it is checked as UTF-8),
/// printed as [`Bounded`] prints a string; bytes that are not UTF-8 show as `\x{ff}`.
#[derive(Clone, Copy, Debug)]
pub struct BoundedBytes<'a>(pub &'a [u8]);

impl fmt::Display for BoundedBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = self.0.utf8_chunks().flat_map(|chunk| {
            chunk
                .valid()
                .chars()
                .map(Unit::Char)
                .chain(chunk.invalid().iter().map(|&b| Unit::Byte(b)))
        });
        write_bounded(f, units, self.0.len())
    }
}

/// A value shown as [`Bounded`] shows a string: for what a peer's data prints as
/// (a shape of many dimensions, a dict's names), written without holding its whole
/// text (its bytes past the limit are only counted).
#[derive(Clone, Copy, Debug)]
pub struct BoundedDisplay<T>(pub T);

impl<T: fmt::Display> fmt::Display for BoundedDisplay<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut cut = Cutter {
            out: f,
            used: 0,
            total: 0,
            cut: false,
        };
        fmt::write(&mut cut, format_args!("{}", self.0))?;
        if cut.cut {
            write!(cut.out, " … ({} bytes)", cut.total)?;
        }
        Ok(())
    }
}

/// What [`BoundedDisplay`] writes through: the shown text up to the limit, then
/// only the count of the bytes.
struct Cutter<'f, 'a> {
    out: &'f mut fmt::Formatter<'a>,
    used: usize,
    total: usize,
    cut: bool,
}

impl fmt::Write for Cutter<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.total = self.total.saturating_add(s.len());
        if self.cut {
            return Ok(());
        }
        let mut buf = [0u8; 16];
        for c in s.chars() {
            let piece = shown(Unit::Char(c), &mut buf);
            if self.used + piece.len() > MAX_PEER_TEXT {
                self.cut = true;
                return Ok(());
            }
            self.used += piece.len();
            self.out.write_str(piece)?;
        }
        Ok(())
    }
}

/// `s` as [`Bounded`] prints it, as a `String` (for errors that hold their text).
pub fn bounded(s: &str) -> String {
    Bounded(s).to_string()
}

/// `s` as [`Bounded`] prints it but with a limit of `max` bytes instead of
/// [`MAX_PEER_TEXT`] (a model's strings, a dependency's error text).
pub fn bounded_to(s: &str, max: usize) -> String {
    struct To<'a>(&'a str, usize);
    impl fmt::Display for To<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write_bounded_to(f, self.0.chars().map(Unit::Char), self.0.len(), self.1)
        }
    }
    To(s, max).to_string()
}

/// One character of the input, or one byte that is not UTF-8.
#[derive(Clone, Copy)]
enum Unit {
    Char(char),
    Byte(u8),
}

/// Whether `c` prints as itself: what `char::escape_debug` leaves alone, and the
/// quotes and the backslash (escaped by it only to quote a literal).
fn prints_as_itself(c: char) -> bool {
    if matches!(c, '\'' | '"' | '\\') {
        return true;
    }
    let mut e = c.escape_debug();
    e.next() == Some(c) && e.next().is_none()
}

/// How `u` is shown, written into `buf`: the character, or its escape (at most 10
/// ASCII bytes: `\u{10ffff}`).
fn shown(u: Unit, buf: &mut [u8; 16]) -> &str {
    match u {
        Unit::Char(c) if prints_as_itself(c) => c.encode_utf8(buf),
        Unit::Char(c) => {
            let mut n = 0;
            for e in c.escape_debug() {
                n += e.encode_utf8(&mut buf[n..]).len();
            }
            std::str::from_utf8(&buf[..n]).unwrap_or("?")
        }
        Unit::Byte(b) => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            let esc = [
                b'\\',
                b'x',
                b'{',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 15)],
                b'}',
            ];
            buf[..6].copy_from_slice(&esc);
            std::str::from_utf8(&buf[..6]).unwrap_or("?")
        }
    }
}

/// Writes `units` (of a text of `total` bytes) shown and escaped, at most
/// [`MAX_PEER_TEXT`] bytes of them, then the suffix if any is left out.
fn write_bounded(f: &mut fmt::Formatter<'_>, units: impl Iterator<Item = Unit>, total: usize) -> fmt::Result {
    write_bounded_to(f, units, total, MAX_PEER_TEXT)
}

/// [`write_bounded`] with a limit of `max` bytes.
fn write_bounded_to(
    f: &mut fmt::Formatter<'_>,
    units: impl Iterator<Item = Unit>,
    total: usize,
    max: usize,
) -> fmt::Result {
    let mut used = 0usize;
    let mut buf = [0u8; 16];
    for u in units {
        let piece = shown(u, &mut buf);
        if used + piece.len() > max {
            return write!(f, " … ({total} bytes)");
        }
        used += piece.len();
        f.write_str(piece)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_printable_string_prints_as_itself() {
        for s in ["", "env 0 failed: boom ✗", "quotes ' \" and \\ stay", "日本語のエラー"] {
            assert_eq!(bounded(s), s);
        }
        let exactly = "a".repeat(MAX_PEER_TEXT);
        assert_eq!(bounded(&exactly), exactly, "256 bytes are not cut");
    }

    #[test]
    fn a_long_string_is_cut_to_the_limit_with_its_size() {
        let s = "x".repeat(MAX_PEER_TEXT + 1);
        assert_eq!(bounded(&s), format!("{} … (257 bytes)", "x".repeat(MAX_PEER_TEXT)));
        let big = "y".repeat(64 << 20);
        let out = bounded(&big);
        assert!(out.ends_with(" … (67108864 bytes)"), "{}", &out[MAX_PEER_TEXT..]);
        assert_eq!(out.len(), MAX_PEER_TEXT + " … (67108864 bytes)".len());
    }

    #[test]
    fn multibyte_characters_are_cut_on_a_boundary() {
        // 3 bytes each: 85 fit in 255 bytes, the 86th would pass 256.
        let s = "✗".repeat(100);
        let out = bounded(&s);
        assert_eq!(out, format!("{} … (300 bytes)", "✗".repeat(85)));
        // A 4-byte character straddling the limit is left out whole.
        let s = format!("{}😀tail", "a".repeat(MAX_PEER_TEXT - 2));
        let out = bounded(&s);
        assert_eq!(out, format!("{} … ({} bytes)", "a".repeat(MAX_PEER_TEXT - 2), s.len()));
    }

    #[test]
    fn control_and_unprintable_characters_are_escaped() {
        assert_eq!(bounded("a\nb\r\tc\0"), "a\\nb\\r\\tc\\0");
        assert_eq!(bounded("\u{1b}[31mred"), "\\u{1b}[31mred");
        assert_eq!(bounded("del\u{7f}"), "del\\u{7f}");
        // Bidirectional overrides, zero-width and line separators do not print.
        assert_eq!(bounded("a\u{202e}b"), "a\\u{202e}b");
        assert_eq!(bounded("a\u{200b}b\u{2028}"), "a\\u{200b}b\\u{2028}");
        let printed = bounded("line one\nERROR forged line\u{1b}]0;title\u{7}");
        assert!(!printed.chars().any(char::is_control), "{printed:?}");
    }

    #[test]
    fn escapes_count_toward_the_limit() {
        // `\u{1}` is 5 bytes: 51 escapes fit in 255, the 52nd would pass 256.
        let s = "\u{1}".repeat(100);
        let out = bounded(&s);
        assert_eq!(out, format!("{} … (100 bytes)", "\\u{1}".repeat(51)));
    }

    #[test]
    fn a_displayed_value_is_bounded_like_a_string() {
        let shape: Vec<usize> = vec![1; 100_000];
        let out = BoundedDisplay(format_args!("{shape:?}")).to_string();
        let whole = format!("{shape:?}");
        assert_eq!(out, format!("{} … ({} bytes)", &whole[..MAX_PEER_TEXT], whole.len()));
        assert_eq!(BoundedDisplay(format_args!("{:?}", [2, 3])).to_string(), "[2, 3]");
        assert_eq!(BoundedDisplay("a\nb\n").to_string(), "a\\nb\\n");
        assert_eq!(BoundedDisplay("a\u{1b}").to_string(), "a\\u{1b}");
    }

    #[test]
    fn bytes_that_are_not_utf8_are_escaped() {
        let b = b"ok\xff\xfe\n";
        assert_eq!(BoundedBytes(b).to_string(), "ok\\x{ff}\\x{fe}\\n");
        assert_eq!(BoundedBytes("plain ✗".as_bytes()).to_string(), "plain ✗");
        let long = vec![0x80u8; 1000];
        assert_eq!(
            BoundedBytes(&long).to_string(),
            format!("{} … (1000 bytes)", "\\x{80}".repeat(42))
        );
    }

    #[test]
    fn adversarial_input_prints_at_most_the_bound_and_no_control_character() {
        let escapes = [
            "\u{0}",
            "\u{1b}",
            "\u{10ffff}",
            "\u{e000}",
            "\u{202e}",
            "\u{301}",
            "a",
            "✗",
            "😀",
        ];
        for (i, a) in escapes.iter().enumerate() {
            for b in &escapes[i..] {
                for n in [1, 40, 85, 86, 129, 10_000] {
                    let s = format!("{a}{b}").repeat(n);
                    let out = bounded(&s);
                    assert!(out.len() <= MAX_PRINTED, "{} bytes for {a:?}{b:?} x {n}", out.len());
                    assert!(!out.chars().any(char::is_control), "{out:?}");
                    let suffix = format!(" … ({} bytes)", s.len());
                    let body = out.strip_suffix(&suffix).unwrap_or(&out);
                    assert!(body.len() <= MAX_PEER_TEXT, "{out:?}");
                    if s.len() <= MAX_PEER_TEXT && s.chars().all(prints_as_itself) {
                        assert_eq!(out, s, "a short printable string is shown whole");
                    }
                }
            }
        }
        let worst = " … (18446744073709551615 bytes)";
        assert_eq!(MAX_PRINTED, MAX_PEER_TEXT + worst.len());
    }
}
