//! Slurm's compressed forms: hostlists (`n[01-16,20],gpu-a[1-2]`) and per-node counts
//! (`2(x3),1`), and the nodes' addresses in `scontrol -o show node`'s lines. Pure; errors say
//! what is wrong, the caller names the variable.

/// Most hosts a hostlist may expand to: far beyond any machine, small enough that a typo
/// (`n[1-99999999999]`) is an error rather than an allocation of gigabytes.
pub(crate) const MAX_HOSTS: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormError {
    #[error("unclosed '['")]
    Unclosed,
    #[error("unexpected ']'")]
    StrayBracket,
    #[error("empty host name")]
    EmptyName,
    #[error("bad range '{0}'")]
    BadRange(String),
    #[error("more than {MAX_HOSTS} hosts")]
    TooMany,
    #[error("bad count '{0}'")]
    BadCount(String),
}

/// Expands a hostlist, in Slurm's order: items left to right; within an item with several
/// bracket groups, the leftmost varies slowest. A number keeps the width of its range's low
/// bound (`n[08-10]` is n08 n09 n10; `n[8-10]` is n8 n9 n10).
pub(crate) fn expand_hostlist(list: &str) -> Result<Vec<String>, FormError> {
    let mut hosts = Vec::new();
    for item in split_top_level(list)? {
        if item.is_empty() {
            return Err(FormError::EmptyName);
        }
        let mut names = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            match rest.find('[') {
                Some(open) => {
                    let close = rest[open..].find(']').ok_or(FormError::Unclosed)? + open;
                    let numbers = expand_ranges(&rest[open + 1..close])?;
                    let prefix = &rest[..open];
                    if names.len().saturating_mul(numbers.len()) > MAX_HOSTS {
                        return Err(FormError::TooMany);
                    }
                    names = names
                        .iter()
                        .flat_map(|n| numbers.iter().map(move |num| format!("{n}{prefix}{num}")))
                        .collect();
                    rest = &rest[close + 1..];
                }
                None => {
                    names.iter_mut().for_each(|n| n.push_str(rest));
                    rest = "";
                }
            }
        }
        if hosts.len() + names.len() > MAX_HOSTS {
            return Err(FormError::TooMany);
        }
        hosts.extend(names);
    }
    Ok(hosts)
}

/// Splits at the commas outside brackets.
fn split_top_level(list: &str) -> Result<Vec<&str>, FormError> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(FormError::Unclosed),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(FormError::StrayBracket),
            ',' if depth == 0 => {
                items.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(FormError::Unclosed);
    }
    items.push(list[start..].trim());
    Ok(items)
}

/// `01-03,7` inside brackets: the numbers as text, zero-padded like their low bound.
fn expand_ranges(ranges: &str) -> Result<Vec<String>, FormError> {
    let mut out = Vec::new();
    for range in ranges.split(',') {
        let bad = || FormError::BadRange(range.chars().take(40).collect());
        let (low, high) = range.split_once('-').unwrap_or((range, range));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(low) || !digits(high) {
            return Err(bad());
        }
        let (from, to) =
            (low.parse::<u64>().map_err(|_| bad())?, high.parse::<u64>().map_err(|_| bad())?);
        if from > to {
            return Err(bad());
        }
        if (to - from) as usize >= MAX_HOSTS || out.len() + (to - from) as usize >= MAX_HOSTS {
            return Err(FormError::TooMany);
        }
        let width = low.len();
        out.extend((from..=to).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

/// Expands per-node counts: `2(x3),1` is 2, 2, 2, 1.
pub(crate) fn expand_counts(counts: &str) -> Result<Vec<u32>, FormError> {
    let mut out: Vec<u32> = Vec::new();
    for item in counts.split(',').map(str::trim) {
        let bad = || FormError::BadCount(item.chars().take(40).collect());
        let (count, times) = match item.split_once('(') {
            Some((count, rest)) => {
                let times = rest.strip_prefix('x').and_then(|t| t.strip_suffix(')'));
                (count, times.ok_or_else(bad)?.parse::<usize>().map_err(|_| bad())?)
            }
            None => (item, 1),
        };
        let count = count.parse::<u32>().map_err(|_| bad())?;
        if times == 0 || out.len() + times > MAX_HOSTS {
            return Err(bad());
        }
        out.extend(std::iter::repeat_n(count, times));
    }
    Ok(out)
}

/// Each node's `NodeAddr` (what slurmctld reaches it at: an address, or a name), by
/// `NodeName`, from `scontrol -o show node`'s output: one line a node of `key=value` fields.
pub(crate) fn node_addresses(shown: &str) -> std::collections::HashMap<String, String> {
    shown
        .lines()
        .filter_map(|line| {
            let field = |key: &str| {
                line.split_whitespace().find_map(|f| f.strip_prefix(key)).map(str::to_string)
            };
            Some((field("NodeName=")?, field("NodeAddr=")?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &str) -> Vec<String> {
        expand_hostlist(list).unwrap()
    }

    #[test]
    fn hostlists_expand_in_slurms_order_keeping_zero_padding() {
        assert_eq!(hosts("n1"), ["n1"]);
        assert_eq!(hosts("n[1-3]"), ["n1", "n2", "n3"]);
        assert_eq!(
            hosts("n[01-03,20],gpu-a[1-2]"),
            ["n01", "n02", "n03", "n20", "gpu-a1", "gpu-a2"]
        );
        assert_eq!(hosts("n[8-10]"), ["n8", "n9", "n10"]);
        assert_eq!(hosts("n[008-010]"), ["n008", "n009", "n010"]);
        assert_eq!(hosts("a,b-c,d[2]"), ["a", "b-c", "d2"]);
        assert_eq!(hosts("node[1-2]-ib"), ["node1-ib", "node2-ib"]);
        assert_eq!(
            hosts("rack[1-2]-n[01-02]"),
            ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
        );
    }

    #[test]
    fn bad_hostlists_say_what_is_wrong() {
        assert_eq!(expand_hostlist("n[1-3"), Err(FormError::Unclosed));
        assert_eq!(expand_hostlist("n1-3]"), Err(FormError::StrayBracket));
        assert_eq!(expand_hostlist("n[[1]]"), Err(FormError::Unclosed));
        assert_eq!(expand_hostlist("a,,b"), Err(FormError::EmptyName));
        assert_eq!(expand_hostlist(""), Err(FormError::EmptyName));
        assert_eq!(expand_hostlist("n[3-1]"), Err(FormError::BadRange("3-1".into())));
        assert_eq!(expand_hostlist("n[a-b]"), Err(FormError::BadRange("a-b".into())));
        assert_eq!(expand_hostlist("n[1-]"), Err(FormError::BadRange("1-".into())));
        assert_eq!(expand_hostlist("n[1-99999999999]"), Err(FormError::TooMany));
        assert_eq!(expand_hostlist("a[1-1024]-b[1-1024]-c[1-2]"), Err(FormError::TooMany));
    }

    #[test]
    fn node_addresses_are_read_from_scontrols_lines() {
        let shown = "NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.214.0.11 \
                     NodeHostName=n1 Version=22.05\nNodeName=n2 NodeAddr=n2-ib State=IDLE\n\
                     garbage\nNodeName=n3 State=DOWN\n";
        let found = node_addresses(shown);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found["n1"], "10.214.0.11");
        assert_eq!(found["n2"], "n2-ib");
    }

    #[test]
    fn counts_expand_with_repetitions() {
        assert_eq!(expand_counts("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(expand_counts("4").unwrap(), [4]);
        assert_eq!(expand_counts("1,2(x2)").unwrap(), [1, 2, 2]);
        assert_eq!(expand_counts("2(x0)"), Err(FormError::BadCount("2(x0)".into())));
        assert_eq!(expand_counts("2(3)"), Err(FormError::BadCount("2(3)".into())));
        assert_eq!(expand_counts("x"), Err(FormError::BadCount("x".into())));
        assert_eq!(
            expand_counts("1(x99999999999)"),
            Err(FormError::BadCount("1(x99999999999)".into()))
        );
    }
}
