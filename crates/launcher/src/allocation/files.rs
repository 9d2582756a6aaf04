//! The host files and lists of Grid Engine, PBS and LSF.

use std::path::PathBuf;

use super::AllocationError;
use crate::hosts::{Host, HostList};
use crate::quote::cut;

/// A host file's parser; its errors are (1-based line, what is wrong).
pub(super) type Parser = fn(&str) -> Result<Vec<Host>, (usize, String)>;

/// Reads the file `var` names and parses it with `parse`.
pub(super) fn read(
    var: &'static str,
    path: PathBuf,
    parse: Parser,
) -> Result<Vec<Host>, AllocationError> {
    let text = std::fs::read_to_string(&path).map_err(|e| AllocationError::Read {
        var,
        path: path.clone(),
        cause: crate::quote::io_error(&e),
    })?;
    let hosts = parse(&text).map_err(|(line, what)| AllocationError::Line { path, line, what })?;
    if hosts.is_empty() {
        return Err(AllocationError::Empty { var });
    }
    Ok(hosts)
}

/// Grid Engine's `PE_HOSTFILE`: `host slots queue processors` per line.
pub(super) fn pe_hostfile(text: &str) -> Result<Vec<Host>, (usize, String)> {
    let mut out = HostList::default();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let (Some(name), Some(slots)) = (words.next(), words.next()) else {
            return Err((
                i + 1,
                format!("expected 'host slots queue processors', found '{}'", cut(line)),
            ));
        };
        let slots = slot_count(slots).map_err(|e| (i + 1, e))?;
        out.add(name, slots);
    }
    Ok(out.into_hosts())
}

/// PBS's `PBS_NODEFILE` and LSF's `LSB_DJOB_HOSTFILE`: a host per line, once per slot.
pub(super) fn one_host_per_slot(text: &str) -> Result<Vec<Host>, (usize, String)> {
    let mut out = HostList::default();
    for (i, line) in text.lines().enumerate() {
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            [] => {}
            [name] => out.add(name, 1),
            _ => return Err((i + 1, format!("expected one host name, found '{}'", cut(line)))),
        }
    }
    Ok(out.into_hosts())
}

/// LSF's `LSB_MCPU_HOSTS`: `hostA 4 hostB 2`.
pub(super) fn lsf_mcpu_hosts(list: &str) -> Result<Vec<Host>, AllocationError> {
    let words: Vec<&str> = list.split_whitespace().collect();
    let bad = |what: String| AllocationError::Form {
        var: "LSB_MCPU_HOSTS",
        value: cut(list),
        error: super::FormError::BadCount(what),
    };
    if !words.len().is_multiple_of(2) {
        return Err(bad(words.last().map_or(String::new(), |w| cut(w))));
    }
    let mut out = HostList::default();
    for pair in words.chunks(2) {
        let slots = slot_count(pair[1]).map_err(|_| bad(cut(pair[1])))?;
        out.add(pair[0], slots);
    }
    Ok(out.into_hosts())
}

fn slot_count(word: &str) -> Result<u32, String> {
    word.parse::<u32>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("bad slot count '{}'", cut(word)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(name: &str, slots: u32) -> Host {
        Host { name: name.into(), slots }
    }

    #[test]
    fn grid_engine_hostfiles_give_slots_per_line() {
        let text = "n1.cluster 4 all.q@n1 UNDEFINED\nn2.cluster 2 all.q@n2 UNDEFINED\n\n";
        assert_eq!(pe_hostfile(text).unwrap(), [h("n1.cluster", 4), h("n2.cluster", 2)]);
        assert_eq!(pe_hostfile("n1 x q UNDEFINED").unwrap_err(), (1, "bad slot count 'x'".into()));
        assert_eq!(pe_hostfile("n1 1\nn2").unwrap_err().0, 2);
    }

    #[test]
    fn pbs_nodefiles_repeat_a_host_per_slot() {
        let text = "n1\nn1\nn2\nn1\n";
        assert_eq!(one_host_per_slot(text).unwrap(), [h("n1", 3), h("n2", 1)]);
        assert_eq!(one_host_per_slot("n1\nn2 n3\n").unwrap_err().0, 2);
    }

    #[test]
    fn lsf_host_lists_pair_hosts_and_slots() {
        assert_eq!(lsf_mcpu_hosts("a 4 b 2 a 1").unwrap(), [h("a", 5), h("b", 2)]);
        let e = lsf_mcpu_hosts("a 4 b").unwrap_err().to_string();
        assert_eq!(e, "LSB_MCPU_HOSTS a 4 b: bad count 'b'");
        assert!(lsf_mcpu_hosts("a 0").is_err());
    }

    #[test]
    fn a_file_that_cannot_be_read_or_is_empty_is_named() {
        let e = read("PBS_NODEFILE", "/nonexistent/nodes".into(), one_host_per_slot).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot read PBS_NODEFILE /nonexistent/nodes: No such file or directory"
        );
        let dir = std::env::temp_dir().join(format!("rlaunch-alloc-{}", std::process::id()));
        std::fs::write(&dir, "\n\n").unwrap();
        let e = read("PBS_NODEFILE", dir.clone(), one_host_per_slot).unwrap_err();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(e.to_string(), "PBS_NODEFILE names no host");
    }
}
