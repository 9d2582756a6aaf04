//! Host lists: `--hosts a,b:2`, hostfiles in Hydra's and Open MPI's forms, and which names
//! mean this machine.

use std::io;
use std::path::{Path, PathBuf};

use crate::quote::{cut, io_error};
use crate::textfile::{self, TextError, MAX_TEXT_FILE};

/// The longest a DNS name can be (RFC 1035), and so the longest host name rlaunch takes.
pub const MAX_HOST_NAME: usize = 253;

/// A host and how many ranks it takes before placement wraps around.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub slots: u32,
}

/// A host list or hostfile rlaunch cannot use.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// The list is quoted cut short: it can be as long as an argument can be.
    #[error("--hosts {}: {error}", cut(.list))]
    List { list: String, error: EntryError },
    #[error("cannot read hostfile {}: {}", .path.display(), io_error(.cause))]
    Read { path: PathBuf, cause: io::Error },
    #[error("hostfile {} is larger than {} MiB", .0.display(), MAX_TEXT_FILE >> 20)]
    TooLarge(PathBuf),
    /// `line` is 1-based: the first line that is not text.
    #[error("{}:{line}: not text (is it a hostfile?)", .path.display())]
    NotText { path: PathBuf, line: usize },
    /// `line` is 1-based.
    #[error("{}:{line}: {error}", .path.display())]
    Line { path: PathBuf, line: usize, error: EntryError },
    #[error("hostfile {} names no host", .0.display())]
    NoHost(PathBuf),
}

/// What is wrong with one host of a list, or one line of a hostfile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("empty host name")]
    EmptyName,
    /// As written.
    #[error("bad slot count '{}'", cut(.0))]
    BadSlots(String),
    #[error("unexpected '{}' after host {}", cut(.word), cut(.host))]
    Unexpected { word: String, host: String },
    /// Longer than [`MAX_HOST_NAME`]: no resolver or ssh would take it.
    #[error("host name '{}' is longer than {MAX_HOST_NAME} characters", cut(.0))]
    NameTooLong(String),
    /// `slots=` (or `:N`) or `max_slots=` a second time on one line: which one was meant?
    #[error("{key} given twice for host {}", cut(.host))]
    Twice { key: &'static str, host: String },
}

/// Parses `a,b:2,c`. A host named twice gets the sum of its slots.
pub fn parse_host_list(list: &str) -> Result<Vec<Host>, HostsError> {
    let mut hosts = HostList::default();
    for item in list.split(',').map(str::trim) {
        let (name, slots) = split_count(item)
            .map_err(|error| HostsError::List { list: list.to_string(), error })?;
        hosts.add(name, slots);
    }
    Ok(hosts.into_hosts())
}

/// `name` or `name:N`.
fn split_count(item: &str) -> Result<(&str, u32), EntryError> {
    let (name, slots) = match item.rsplit_once(':') {
        Some((name, n)) => (name, parse_slots(n)?),
        None => (item, 1),
    };
    if name.is_empty() {
        return Err(EntryError::EmptyName);
    }
    if name.len() > MAX_HOST_NAME {
        return Err(EntryError::NameTooLong(name.to_string()));
    }
    Ok((name, slots))
}

fn parse_slots(n: &str) -> Result<u32, EntryError> {
    let slots = n.trim().parse::<u32>().ok().filter(|&s| s > 0);
    slots.ok_or_else(|| EntryError::BadSlots(n.to_string()))
}

/// Hosts in order of first mention; a host named twice gets the sum of its slots (at most
/// u32::MAX: past that, slots mean nothing more). Indexed by name, so that lists of a
/// hundred thousand hosts merge in linear time.
#[derive(Default)]
pub(crate) struct HostList {
    hosts: Vec<Host>,
    index: std::collections::HashMap<String, usize>,
}

impl HostList {
    pub(crate) fn add(&mut self, name: &str, slots: u32) {
        match self.index.get(name) {
            Some(&i) => self.hosts[i].slots = self.hosts[i].slots.saturating_add(slots),
            None => {
                self.index.insert(name.to_string(), self.hosts.len());
                self.hosts.push(Host { name: name.to_string(), slots });
            }
        }
    }

    pub(crate) fn into_hosts(self) -> Vec<Host> {
        self.hosts
    }
}

/// Reads a hostfile. Lines: `host`, `host:N`, `host slots=N [max_slots=M]`, `#` comments,
/// blank lines. Errors name the file and line: `hosts:3: bad slot count 'x'`.
pub fn read_hostfile(path: &Path) -> Result<Vec<Host>, HostsError> {
    let text = textfile::read(path).map_err(|e| match e {
        TextError::Read(cause) => HostsError::Read { path: path.to_path_buf(), cause },
        TextError::TooLarge => HostsError::TooLarge(path.to_path_buf()),
        TextError::NotText { line } => HostsError::NotText { path: path.to_path_buf(), line },
    })?;
    let hosts = parse_hostfile(&text).map_err(|(line, error)| HostsError::Line {
        path: path.to_path_buf(),
        line,
        error,
    })?;
    if hosts.is_empty() {
        return Err(HostsError::NoHost(path.to_path_buf()));
    }
    Ok(hosts)
}

/// The text of a hostfile; errors carry the 1-based line number.
pub(crate) fn parse_hostfile(text: &str) -> Result<Vec<Host>, (usize, EntryError)> {
    let mut hosts = HostList::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let first = words.next().expect("non-empty line");
        let (name, mut slots) = split_count(first).map_err(|e| (i + 1, e))?;
        let twice = |key| (i + 1, EntryError::Twice { key, host: name.to_string() });
        let mut slots_given = first.contains(':');
        let mut max_given = false;
        for word in words {
            match word.split_once('=') {
                Some(("slots", n)) => {
                    if std::mem::replace(&mut slots_given, true) {
                        return Err(twice("slots"));
                    }
                    slots = parse_slots(n).map_err(|e| (i + 1, e))?;
                }
                // Open MPI's cap on oversubscription; rlaunch wraps around like Hydra instead.
                Some(("max_slots" | "max-slots", n)) => {
                    if std::mem::replace(&mut max_given, true) {
                        return Err(twice("max_slots"));
                    }
                    parse_slots(n).map_err(|e| (i + 1, e))?;
                }
                _ => {
                    let (word, host) = (word.to_string(), name.to_string());
                    return Err((i + 1, EntryError::Unexpected { word, host }));
                }
            }
        }
        hosts.add(name, slots);
    }
    Ok(hosts.into_hosts())
}

/// Names that mean this machine.
pub fn is_local(name: &str, own: &str) -> bool {
    name == "localhost"
        || name == own
        || own.split('.').next() == Some(name)
        || name.starts_with("127.")
        || name == "::1"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(name: &str, slots: u32) -> Host {
        Host { name: name.into(), slots }
    }

    #[test]
    fn slots_saturate_and_long_lists_merge_in_order() {
        let hosts = parse_host_list("a:4294967295,b,a:1").unwrap();
        assert_eq!(hosts, vec![h("a", u32::MAX), h("b", 1)]);
        let list: Vec<String> = (0..50_000).map(|i| format!("n{}", i % 25_000)).collect();
        let hosts = parse_host_list(&list.join(",")).unwrap();
        assert_eq!(hosts.len(), 25_000);
        assert_eq!(hosts[24_999], h("n24999", 2));
    }

    #[test]
    fn host_lists_parse_and_merge() {
        assert_eq!(parse_host_list("a,b:2,a:3").unwrap(), vec![h("a", 4), h("b", 2)]);
        assert_eq!(
            parse_host_list("a:x").unwrap_err().to_string(),
            "--hosts a:x: bad slot count 'x'"
        );
        assert!(parse_host_list("a,,b").is_err());
    }

    #[test]
    fn names_longer_than_dns_allows_are_refused_and_quoted_short() {
        let long = "a".repeat(MAX_HOST_NAME + 1);
        let error = parse_hostfile(&format!("n1\n{long}:2\n")).unwrap_err();
        assert_eq!(error.0, 2);
        let quoted = format!("{}...", &long[..crate::quote::QUOTED_MAX]);
        assert_eq!(
            error.1.to_string(),
            format!("host name '{quoted}' is longer than 253 characters")
        );
        assert!(parse_host_list(&"b".repeat(MAX_HOST_NAME)).is_ok());
        let list = format!("{long},b");
        let error = parse_host_list(&list).unwrap_err().to_string();
        assert!(error.starts_with(&format!("--hosts {quoted}: host name '{quoted}'")), "{error}");
        let slots = format!("n1:{}", "9".repeat(1000));
        assert!(parse_hostfile(&slots).unwrap_err().1.to_string().len() < 100);
    }

    #[test]
    fn hostfiles_take_hydra_and_open_mpi_forms() {
        let text = "# cluster\n\nn1\nn2:4\nn3 slots=2 max_slots=8  # big\nn1:2\n";
        assert_eq!(parse_hostfile(text).unwrap(), vec![h("n1", 3), h("n2", 4), h("n3", 2)]);
        let bad_slots = EntryError::BadSlots("x".into());
        assert_eq!(parse_hostfile("a\nb\nc:x\n").unwrap_err(), (3, bad_slots));
        assert_eq!(parse_hostfile("a slots=0").unwrap_err().0, 1);
        let error = parse_hostfile("a colour=red").unwrap_err().1.to_string();
        assert_eq!(error, "unexpected 'colour=red' after host a");
    }

    #[test]
    fn a_key_given_twice_is_refused() {
        let twice = |line: &str| parse_hostfile(line).unwrap_err().1.to_string();
        assert_eq!(twice("n1 slots=2 slots=3"), "slots given twice for host n1");
        assert_eq!(twice("n1:2 slots=3"), "slots given twice for host n1");
        assert_eq!(twice("n1 max_slots=2 max-slots=3"), "max_slots given twice for host n1");
        assert!(parse_hostfile("n1 slots=2 max_slots=3").is_ok());
    }
}
