//! The text files a user names on the command line (hostfiles, configfiles), read with care:
//! a size bound, so that `-f /dev/zero` ends with a line instead of all memory, and a binary
//! file named by its first line that is not text, so the error can say `FILE:LINE`.

use std::io::{self, Read};
use std::path::Path;

/// More than any hostfile or configfile holds: a million hosts of 60 bytes.
pub(crate) const MAX_TEXT_FILE: u64 = 64 << 20;

/// Why a file is not a text file rlaunch can read.
#[derive(Debug)]
pub(crate) enum TextError {
    Read(io::Error),
    /// Longer than [`MAX_TEXT_FILE`].
    TooLarge,
    /// `line` (1-based) holds bytes that are not UTF-8, or control characters.
    NotText {
        line: usize,
    },
}

/// The contents of the file at `path`, checked to be text.
pub(crate) fn read(path: &Path) -> Result<String, TextError> {
    let file = std::fs::File::open(path).map_err(TextError::Read)?;
    let mut bytes = Vec::new();
    file.take(MAX_TEXT_FILE + 1).read_to_end(&mut bytes).map_err(TextError::Read)?;
    if bytes.len() as u64 > MAX_TEXT_FILE {
        return Err(TextError::TooLarge);
    }
    if let Some(line) = first_binary_line(&bytes) {
        return Err(TextError::NotText { line });
    }
    Ok(String::from_utf8(bytes).expect("checked to be UTF-8"))
}

/// The 1-based number of the first line that is not UTF-8 text, or holds a control
/// character other than a tab or a carriage return (a NUL says "binary" as surely).
fn first_binary_line(bytes: &[u8]) -> Option<usize> {
    let control = |c: char| c.is_control() && !matches!(c, '\t' | '\r' | '\u{c}');
    bytes
        .split(|&b| b == b'\n')
        .position(|line| match std::str::from_utf8(line) {
            Ok(text) => text.contains(control),
            Err(_) => true,
        })
        .map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_that_is_not_text_is_named() {
        assert_eq!(first_binary_line(b"a\nb\r\n\tc\n"), None);
        assert_eq!(first_binary_line(b"a\nb\xff\nc"), Some(2));
        assert_eq!(first_binary_line(b"\0"), Some(1));
        assert_eq!(first_binary_line(b"a\n\n\x1b[31m"), Some(3));
        assert_eq!(first_binary_line("ünïcode\n".as_bytes()), None);
    }
}
