//! The parsers of what users type, with the properties they must hold whatever the input:
//! the entry points of the cargo-fuzz targets (fuzz/) and of the replay of their corpora
//! (tests/fuzz_corpus.rs). An error is one line, short whatever was typed (culprits are
//! quoted cut); what parses is a job rlaunch can lay out.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

use crate::hosts::{self, HostsError};
use crate::options::{self, Request};

/// Longest error line a user can provoke, however long the input.
pub const MAX_ERROR: usize = 1024;

fn error_is_one_short_line(error: &str, input: &str) {
    assert!(!error.contains('\n'), "an error of two lines for {input:?}: {error:?}");
    assert!(error.len() <= MAX_ERROR, "an error of {} bytes for {input:?}", error.len());
}

/// A hostfile's text: hosts with names a host can have and at least one slot, or one line
/// naming the file and line.
pub fn hostfile(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match hosts::parse_hostfile(text) {
        Ok(list) => {
            for host in list {
                assert!(!host.name.is_empty() && host.name.len() <= 253, "{:?}", host.name);
                assert!(host.slots > 0, "{host:?}");
            }
        }
        Err((line, error)) => {
            let path = Path::new("hosts").to_path_buf();
            let error = HostsError::Line { path, line, error }.to_string();
            assert!(line >= 1 && line <= text.lines().count(), "line {line} of {text:?}");
            error_is_one_short_line(&error, text);
        }
    }
    if let Err(error) = hosts::parse_host_list(text) {
        error_is_one_short_line(&error.to_string(), text);
    }
}

/// A command line: the input's NUL-separated words, read as rlaunch's arguments in an empty
/// environment. Reads no file (a path that exists is not the fuzzer's to find).
pub fn command_line(data: &[u8]) {
    let args: Vec<OsString> =
        data.split(|&b| b == 0).map(|word| OsString::from_vec(word.to_vec())).collect();
    let words = || String::from_utf8_lossy(data).into_owned();
    if args.iter().any(|a| a.to_string_lossy().contains("configfile")) {
        return;
    }
    match options::parse(&args, &[], Path::new("/nonexistent")) {
        Ok(Request::Run(_) | Request::Help { .. } | Request::Version | Request::Info) => {}
        Err(error) => error_is_one_short_line(&error.to_string(), &words()),
    }
}
