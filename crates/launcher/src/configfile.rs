//! `-configfile FILE`: Hydra's MPMD segments, one per line, in words split like a shell would
//! (quotes and backslashes, no expansion); `#` comments, `\` at the end of a line continues it.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use crate::args::{self, ArgsError, Part};
use crate::quote::io_error;
use crate::textfile::{self, TextError, MAX_TEXT_FILE};

/// A configfile that cannot be read, or a line of it that names no segment.
#[derive(Debug, thiserror::Error)]
pub enum ConfigfileError {
    #[error("cannot read {}: {}", .path.display(), io_error(.cause))]
    Read { path: PathBuf, cause: io::Error },
    #[error("{} is larger than {} MiB", .0.display(), MAX_TEXT_FILE >> 20)]
    TooLarge(PathBuf),
    /// `line` is 1-based: the first line that is not text.
    #[error("{}:{line}: not text (is it a configfile?)", .path.display())]
    NotText { path: PathBuf, line: usize },
    /// `line` is 1-based: the first line of a continued one.
    #[error("{}:{line}: {error}", .path.display())]
    Line { path: PathBuf, line: usize, error: LineError },
    #[error("{} names no program", .0.display())]
    NoProgram(PathBuf),
}

/// What is wrong with one line of a configfile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// The quote character.
    #[error("unterminated {0} quote")]
    Unterminated(char),
    #[error(transparent)]
    Args(#[from] ArgsError),
    #[error("expected options and one program, without ':'")]
    NotOneProgram,
}

/// The segments the configfile at `path` names: one part per line, each with its options and
/// one program. Errors name the file and line: `job.conf:2: unknown option '-nn'`.
pub fn read(path: &Path) -> Result<Vec<Part>, ConfigfileError> {
    let at = |line, error| ConfigfileError::Line { path: path.to_path_buf(), line, error };
    let text = textfile::read(path).map_err(|e| match e {
        TextError::Read(cause) => ConfigfileError::Read { path: path.to_path_buf(), cause },
        TextError::TooLarge => ConfigfileError::TooLarge(path.to_path_buf()),
        TextError::NotText { line } => ConfigfileError::NotText { path: path.to_path_buf(), line },
    })?;
    let lines = split_configfile(&text).map_err(|(line, error)| at(line, error))?;
    if lines.is_empty() {
        return Err(ConfigfileError::NoProgram(path.to_path_buf()));
    }
    let mut parts = Vec::new();
    for (line, words) in lines {
        let mut found = args::split(&words).map_err(|e| at(line, e.into()))?;
        if found.len() != 1 || found[0].command.is_empty() {
            return Err(at(line, LineError::NotOneProgram));
        }
        parts.push(found.remove(0));
    }
    Ok(parts)
}

/// A configfile line's number and words.
type ConfigLine = (usize, Vec<OsString>);

/// Splits a configfile into parts: one per line, `#` comments, `\` at the end of a line
/// continues it, words split like a shell would (quotes and backslashes, no expansion).
/// Errors carry the file's 1-based line number.
fn split_configfile(text: &str) -> Result<Vec<ConfigLine>, (usize, LineError)> {
    let mut lines = Vec::new();
    let mut pending = String::new();
    let mut start = 0;
    for (i, raw) in text.lines().enumerate() {
        if pending.is_empty() {
            start = i + 1;
        }
        match raw.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(raw);
                let words = shell_words(&pending).map_err(|e| (start, e))?;
                if !words.is_empty() {
                    lines.push((start, words));
                }
                pending.clear();
            }
        }
    }
    if !pending.is_empty() {
        let words = shell_words(&pending).map_err(|e| (start, e))?;
        if !words.is_empty() {
            lines.push((start, words));
        }
    }
    Ok(lines)
}

/// Words of one line: 'single' and "double" quotes, backslash escapes, `#` starts a comment
/// outside quotes at the start of a word.
fn shell_words(line: &str) -> Result<Vec<OsString>, LineError> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(w) = word.take() {
                    words.push(w.into());
                }
            }
            '#' if word.is_none() => break,
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err(LineError::Unterminated('\'')),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => w.push(c),
                            None => return Err(LineError::Unterminated('"')),
                        },
                        Some(c) => w.push(c),
                        None => return Err(LineError::Unterminated('"')),
                    }
                }
            }
            '\\' => {
                if let Some(c) = chars.next() {
                    word.get_or_insert_with(String::new).push(c);
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(w) = word {
        words.push(w.into());
    }
    Ok(words)
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::os;

    fn words(line: &str) -> Vec<OsString> {
        line.split_whitespace().map(os).collect()
    }

    #[test]
    fn configfiles_have_comments_continuations_and_quotes() {
        let text = "# master\n-n 1 ./m\n\n-n 2 -env A 'x y' \\\n  ./w \"q\\\"z\" # two\n";
        let lines = split_configfile(text).unwrap();
        assert_eq!(lines[0], (2, words("-n 1 ./m")));
        assert_eq!(lines[1].0, 4);
        assert_eq!(lines[1].1[4], os("x y"));
        assert_eq!(lines[1].1[6], os("q\"z"));
        assert_eq!(split_configfile("a\n'b\n").unwrap_err(), (2, LineError::Unterminated('\'')));
        assert_eq!(LineError::Unterminated('"').to_string(), "unterminated \" quote");
    }
}
