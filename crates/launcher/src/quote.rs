//! How rlaunch's one-line messages show what it did not write itself (a host name, a file's
//! line, a program's message, an operating system's error): bounded, on one line, and
//! unable to pass for something else.

use std::io;

/// At most this many characters of a culprit are quoted back to the user.
pub(crate) const QUOTED_MAX: usize = 64;

/// `text` as an error line quotes it: whole when short, else its first [`QUOTED_MAX`]
/// characters and `...`, with control characters escaped (`\n`). Input can be a megabyte
/// long and hold newlines; an error line is one short line.
pub(crate) fn cut(text: &str) -> String {
    let mut quoted = String::new();
    let mut shown = 0;
    for c in text.chars() {
        // Invisible or reordering characters (zero-width, bidi controls, line and paragraph
        // separators) could make a culprit read as something else: shown escaped too.
        let invisible = matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}' | '\u{feff}');
        let escaped = (c.is_control() || invisible).then(|| c.escape_default());
        let width = escaped.clone().map_or(1, |e| e.count());
        if shown + width > QUOTED_MAX {
            quoted.push_str("...");
            break;
        }
        shown += width;
        match escaped {
            Some(e) => quoted.extend(e),
            None => quoted.push(c),
        }
    }
    quoted
}

/// An I/O error as the end of a sentence: its description without Rust's `(os error N)`.
pub fn io_error(e: &io::Error) -> String {
    rlaunch_tree::io_sentence(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_culprits_are_cut() {
        assert_eq!(cut("n1"), "n1");
        let long = "é".repeat(100);
        assert_eq!(cut(&long), format!("{}...", "é".repeat(QUOTED_MAX)));
        assert_eq!(cut(&"a".repeat(QUOTED_MAX)), "a".repeat(QUOTED_MAX));
        assert_eq!(cut("a\u{202e}b"), "a\\u{202e}b", "a bidi override is shown, not obeyed");
        // Found by fuzzing: a newline in --hosts made a two-line error.
        assert_eq!(cut("a\nb\t\u{1b}"), "a\\nb\\t\\u{1b}");
    }

    #[test]
    fn io_errors_read_as_the_end_of_a_sentence() {
        let e = io::Error::from_raw_os_error(2);
        assert_eq!(io_error(&e), "No such file or directory");
        assert_eq!(io_error(&io::Error::other("no route")), "no route");
    }
}
