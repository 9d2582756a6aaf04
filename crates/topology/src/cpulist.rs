//! Linux CPU lists (`0-3,8,10-11`), as sysfs writes them and people read them.

/// Parses a Linux cpulist (`0-3,8,10-11`; empty for none): sorted, each CPU once.
pub fn parse(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// Formats CPU ids as a Linux cpulist: `0-3,8,10-11`.
pub fn format(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        while i + 1 < sorted.len() && sorted[i + 1] == sorted[i] + 1 {
            i += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if sorted[i] == start {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{}", sorted[i]));
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_round_trip() {
        assert_eq!(format(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format(&[5]), "5");
        assert_eq!(format(&[3, 1, 2, 2]), "1-3");
        assert_eq!(format(&[]), "");
        assert_eq!(parse("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse(""), Some(vec![]));
        assert_eq!(parse("3-1"), None);
        assert_eq!(parse("x"), None);
    }
}
