//! Checking what `rankprog flood` wrote after it went through the launcher's stdio relay.
//!
//! A flood line is 64 bytes: `r<rank, 6 digits> <seq, 12 digits> `, 42 padding bytes
//! (`b'a' + (rank + seq + i) % 26` for the i-th), `\n`. Lines of different ranks may
//! interleave, but each line must arrive whole, and each rank's lines in order from 0 with
//! none missing. With `rlaunch -l`, a line may start with `[<rank>] `.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::{Duration, Instant};

/// Bytes in one flood line, newline included.
pub const FLOOD_LINE_LEN: usize = 64;

const HEAD_LEN: usize = 21;

/// Line `seq` of rank `rank`, exactly as `rankprog flood` writes it.
pub fn flood_line(rank: u32, seq: u64) -> [u8; FLOOD_LINE_LEN] {
    let mut line = [0; FLOOD_LINE_LEN];
    let head = format!("r{rank:06} {seq:012} ");
    line[..HEAD_LEN].copy_from_slice(head.as_bytes());
    let base = u64::from(rank) + seq;
    for (i, b) in line[HEAD_LEN..FLOOD_LINE_LEN - 1].iter_mut().enumerate() {
        *b = b'a' + ((base + i as u64) % 26) as u8;
    }
    line[FLOOD_LINE_LEN - 1] = b'\n';
    line
}

/// How many lines `rankprog flood <bytes>` writes: bytes rounded up to whole lines.
pub fn flood_lines(bytes: u64) -> u64 {
    bytes.div_ceil(FLOOD_LINE_LEN as u64)
}

/// What [`scan_flood`] found in an intact output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FloodReport {
    /// Lines received from each rank.
    pub lines: BTreeMap<u32, u64>,
    /// Lines that carried a `[<rank>] ` prefix.
    pub prefixed: u64,
}

impl FloodReport {
    pub fn total_lines(&self) -> u64 {
        self.lines.values().sum()
    }

    /// Whether every line carried its `[<rank>] ` prefix (as with `rlaunch -l`).
    pub fn all_prefixed(&self) -> bool {
        self.prefixed == self.total_lines()
    }
}

/// Checks that `output` holds only whole flood lines, each rank's in order from 0 without
/// gaps, and counts them.
pub fn scan_flood(output: &[u8]) -> Result<FloodReport, String> {
    let mut scanner = FloodScanner::default();
    scanner.feed(output)?;
    scanner.finish()
}

/// [`scan_flood`] for output that comes in pieces (from a pipe, say), with the same rules
/// and messages: feed it each piece as it comes, then [`FloodScanner::finish`] at the end.
#[derive(Debug, Default)]
pub struct FloodScanner {
    report: FloodReport,
    /// Ranks whose output may have lost a piece on its way, or had a piece come late (it
    /// went two ways): a line of theirs damaged by the cut is skipped, and their lines are
    /// counted in whatever order they come.
    lenient: std::collections::BTreeSet<u32>,
    /// The start of a line whose newline has not come yet.
    partial: Vec<u8>,
    /// Lines and bytes taken so far, for messages.
    line: usize,
    offset: usize,
}

impl FloodScanner {
    /// A scanner that lets the output of `ranks` have gaps (see [`FloodScanner::lenient`]).
    pub fn lenient(ranks: impl IntoIterator<Item = u32>) -> FloodScanner {
        FloodScanner { lenient: ranks.into_iter().collect(), ..FloodScanner::default() }
    }

    /// Checks every line `piece` completes; the first bad one is the error.
    pub fn feed(&mut self, piece: &[u8]) -> Result<(), String> {
        let mut rest = piece;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (line, after) = rest.split_at(nl + 1);
            rest = after;
            if self.partial.is_empty() {
                self.check(line)?;
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                self.check(&whole)?;
            }
        }
        self.partial.extend_from_slice(rest);
        Ok(())
    }

    /// What was seen so far, whole lines only.
    pub fn report(&self) -> &FloodReport {
        &self.report
    }

    /// At the end of the output: a line without its newline is an error.
    pub fn finish(self) -> Result<FloodReport, String> {
        if !self.partial.is_empty() {
            let at = format!("line {} (byte {})", self.line + 1, self.offset);
            return Err(format!("{at}: output ends inside a line: {}", show(&self.partial)));
        }
        Ok(self.report)
    }

    fn check(&mut self, line: &[u8]) -> Result<(), String> {
        self.line += 1;
        let at = format!("line {} (byte {})", self.line, self.offset);
        self.offset += line.len();
        let (prefix, body) = split_prefix(line);
        // A lenient rank's line joined to another's part across a cut: its head is whole.
        let joined = body.len() != FLOOD_LINE_LEN;
        if joined && head_rank(body).is_some_and(|r| self.lenient.contains(&r)) {
            return Ok(());
        }
        let (rank, seq) =
            parse_head(body).ok_or_else(|| format!("{at}: not a flood line: {}", show(line)))?;
        // parse_head took the head's every byte; the rest is the padding and the newline.
        let base = u64::from(rank) + seq;
        let pad = &body[HEAD_LEN..FLOOD_LINE_LEN - 1];
        let padded = pad.iter().zip(base..).all(|(&b, k)| b == b'a' + (k % 26) as u8);
        if !padded || body[FLOOD_LINE_LEN - 1] != b'\n' {
            if self.lenient.contains(&rank) {
                return Ok(());
            }
            return Err(format!("{at}: damaged line: {}", show(line)));
        }
        if let Some(prefix_rank) = prefix {
            if prefix_rank != rank {
                return Err(format!(
                    "{at}: prefix [{prefix_rank}] on a line of rank {rank}: {}",
                    show(line)
                ));
            }
            self.report.prefixed += 1;
        }
        let expected = self.report.lines.entry(rank).or_insert(0);
        if self.lenient.contains(&rank) {
            if seq < *expected {
                return Ok(());
            }
            *expected = seq;
        }
        if seq != *expected {
            return Err(format!(
                "{at}: rank {rank} line {seq} where line {expected} was due (lines lost, \
                 repeated or reordered)"
            ));
        }
        *expected += 1;
        Ok(())
    }
}

/// Reads `pipe` to its end, checking each line as it comes ([`FloodScanner`]), at no more
/// than `rate` bytes a second if one is given (a slow reader); after a fault it reads on
/// unchecked, so that the writer is never blocked. Returns the bytes read and the verdict.
pub fn scan_flood_stream(pipe: impl Read, rate: Option<u64>) -> (u64, Result<FloodReport, String>) {
    scan_flood_stream_with(pipe, rate, FloodScanner::default())
}

/// [`scan_flood_stream`] with a scanner of the caller's (a [`FloodScanner::lenient`] one).
pub fn scan_flood_stream_with(
    mut pipe: impl Read,
    rate: Option<u64>,
    mut scanner: FloodScanner,
) -> (u64, Result<FloodReport, String>) {
    let start = Instant::now();
    // Small reads keep a slow reader's pace even.
    let mut buf = vec![0; if rate.is_some() { 16 << 10 } else { 256 << 10 }];
    let mut total = 0u64;
    let mut fault = None;
    loop {
        if let Some(rate) = rate {
            let due = Duration::from_secs_f64(total as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let n = match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                fault.get_or_insert_with(|| format!("cannot read the output: {e}"));
                break;
            }
        };
        total += n as u64;
        if fault.is_none() {
            fault = scanner.feed(&buf[..n]).err();
        }
    }
    (total, fault.map_or_else(|| scanner.finish(), Err))
}

/// [`scan_flood`], and every rank in `0..ranks` (and no other) sent all the lines of
/// `rankprog flood <bytes_per_rank>`.
pub fn check_flood(output: &[u8], ranks: u32, bytes_per_rank: u64) -> Result<FloodReport, String> {
    let report = scan_flood(output)?;
    let want = flood_lines(bytes_per_rank);
    if let Some(stranger) = report.lines.keys().find(|&&r| r >= ranks) {
        return Err(format!("lines from rank {stranger}, but there are {ranks} ranks"));
    }
    for rank in 0..ranks {
        let got = report.lines.get(&rank).copied().unwrap_or(0);
        if got != want {
            return Err(format!("rank {rank} sent {got} lines of {want}"));
        }
    }
    Ok(report)
}

/// Splits a `[<rank>] ` prefix off a line, if there is one.
fn split_prefix(line: &[u8]) -> (Option<u32>, &[u8]) {
    let parsed = (|| {
        let rest = line.strip_prefix(b"[")?;
        let close = rest.iter().position(|&b| b == b']')?;
        let rank = std::str::from_utf8(&rest[..close]).ok()?.parse().ok()?;
        let body = rest[close + 1..].strip_prefix(b" ")?;
        Some((Some(rank), body))
    })();
    parsed.unwrap_or((None, line))
}

fn parse_head(body: &[u8]) -> Option<(u32, u64)> {
    if body.len() != FLOOD_LINE_LEN || body[0] != b'r' || body[7] != b' ' || body[20] != b' ' {
        return None;
    }
    let digits = |range: std::ops::Range<usize>| {
        let text = std::str::from_utf8(&body[range]).ok()?;
        text.bytes().all(|b| b.is_ascii_digit()).then_some(text)
    };
    let rank = digits(1..7)?.parse().ok()?;
    let seq = digits(8..20)?.parse().ok()?;
    Some((rank, seq))
}

/// The rank of a line's head, whatever follows it.
fn head_rank(body: &[u8]) -> Option<u32> {
    let mut head = body.get(..HEAD_LEN)?.to_vec();
    head.resize(FLOOD_LINE_LEN, b'a');
    parse_head(&head).map(|(rank, _)| rank)
}

/// A line for an error message, escaped and cut short.
fn show(line: &[u8]) -> String {
    const MAX: usize = 100;
    let cut = &line[..line.len().min(MAX)];
    let more = if line.len() > MAX { "..." } else { "" };
    format!("\"{}\"{more}", cut.escape_ascii())
}

/// Line `seq` of rank `rank` as `rankprog ragged` writes it.
pub fn ragged_line(rank: u32, seq: u64) -> Vec<u8> {
    let mut line = format!("r{rank:06} {seq:012} ").into_bytes();
    let base = u64::from(rank) + seq;
    line.extend((0..seq * 7919 % 3001).map(|i| b'a' + ((base + i) % 26) as u8));
    line.push(b'\n');
    line
}

/// Checks that `output` holds only whole `rankprog ragged` lines of ranks `0..ranks`, each
/// rank's in order from 0 and none missing up to `bytes` of them (lines of different ranks
/// may interleave); returns the lines per rank.
pub fn check_ragged(output: &[u8], ranks: u32, bytes: u64) -> Result<Vec<u64>, String> {
    let mut next = vec![0u64; ranks as usize];
    let mut written = vec![0u64; ranks as usize];
    let mut at = 0;
    for line in output.split_inclusive(|&b| b == b'\n') {
        let bad = || {
            format!(
                "bad line at byte {at}: {:?}",
                String::from_utf8_lossy(&line[..line.len().min(40)])
            )
        };
        let rank: u32 = std::str::from_utf8(line.get(1..7).ok_or_else(bad)?)
            .ok()
            .and_then(|r| r.parse().ok())
            .filter(|&r| r < ranks)
            .ok_or_else(bad)?;
        let seq = next[rank as usize];
        if line != ragged_line(rank, seq) {
            return Err(format!("rank {rank}: line {seq} is wrong or missing; {}", bad()));
        }
        next[rank as usize] += 1;
        written[rank as usize] += line.len() as u64;
        at += line.len();
    }
    for (rank, &w) in written.iter().enumerate() {
        if w < bytes {
            return Err(format!("rank {rank}: only {w} of {bytes} bytes arrived"));
        }
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks' lines interleaved round-robin, as a relay may deliver them.
    fn interleaved(ranks: u32, lines: u64, prefix: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for seq in 0..lines {
            for rank in 0..ranks {
                if prefix {
                    out.extend_from_slice(format!("[{rank}] ").as_bytes());
                }
                out.extend_from_slice(&flood_line(rank, seq));
            }
        }
        out
    }

    #[test]
    fn line_format() {
        let line = flood_line(3, 42);
        assert_eq!(&line[..HEAD_LEN], b"r000003 000000000042 ");
        assert_eq!(line[HEAD_LEN], b'a' + 45 % 26);
        assert_eq!(line.len(), 64);
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(flood_lines(0), 0);
        assert_eq!(flood_lines(1), 1);
        assert_eq!(flood_lines(128), 2);
        assert_eq!(flood_lines(129), 3);
    }

    #[test]
    fn accepts_intact_interleaved_output() {
        let report = check_flood(&interleaved(3, 50, false), 3, 50 * 64).unwrap();
        assert_eq!(report.total_lines(), 150);
        assert_eq!(report.prefixed, 0);
        assert!(check_flood(b"", 2, 0).is_ok());
    }

    #[test]
    fn accepts_rank_prefixes() {
        let report = check_flood(&interleaved(12, 10, true), 12, 640).unwrap();
        assert!(report.all_prefixed());
        let wrong = [b"[1] ".as_slice(), &flood_line(0, 0)].concat();
        let err = scan_flood(&wrong).unwrap_err();
        assert!(err.contains("prefix [1] on a line of rank 0"), "{err}");
    }

    #[test]
    fn rejects_a_damaged_byte() {
        let mut out = interleaved(2, 10, false);
        out[5 * 64 + 30] ^= 1;
        let err = scan_flood(&out).unwrap_err();
        assert!(err.starts_with("line 6 "), "{err}");
    }

    #[test]
    fn rejects_mixed_lines() {
        let mut out = interleaved(2, 4, false);
        out.splice(64 + 32..64 + 32, flood_line(1, 9));
        assert!(scan_flood(&out).is_err());
    }

    #[test]
    fn rejects_gaps_repeats_and_reordering() {
        let out = interleaved(2, 10, false);
        let mut gap = out.clone();
        gap.drain(4 * 64..5 * 64);
        let err = scan_flood(&gap).unwrap_err();
        assert!(err.contains("rank 0 line 3 where line 2 was due"), "{err}");

        let mut repeat = out.clone();
        repeat.splice(0..0, flood_line(0, 0));
        assert!(scan_flood(&repeat).is_err());

        let mut swapped = out;
        swapped[..64].copy_from_slice(&flood_line(0, 1));
        swapped[2 * 64..3 * 64].copy_from_slice(&flood_line(0, 0));
        assert!(scan_flood(&swapped).is_err());
    }

    #[test]
    fn rejects_truncation_and_missing_ranks() {
        let out = interleaved(2, 10, false);
        let err = scan_flood(&out[..out.len() - 1]).unwrap_err();
        assert!(err.contains("ends inside a line"), "{err}");
        let err = check_flood(&out[..out.len() - 64], 2, 640).unwrap_err();
        assert_eq!(err, "rank 1 sent 9 lines of 10");
        let err = check_flood(&out, 3, 640).unwrap_err();
        assert_eq!(err, "rank 2 sent 0 lines of 10");
        let err = check_flood(&out, 1, 640).unwrap_err();
        assert_eq!(err, "lines from rank 1, but there are 1 ranks");
    }

    #[test]
    fn pieces_of_any_size_scan_as_the_whole() {
        let out = interleaved(3, 20, true);
        for size in [1, 7, 64, 65, 1000] {
            let mut scanner = FloodScanner::default();
            for piece in out.chunks(size) {
                scanner.feed(piece).unwrap();
            }
            assert_eq!(scanner.finish(), scan_flood(&out), "pieces of {size}");
        }
        let mut scanner = FloodScanner::default();
        scanner.feed(&out[..100]).unwrap();
        assert_eq!(scanner.report().total_lines(), 1);
        let err = scanner.finish().unwrap_err();
        assert!(err.starts_with("line 2 (byte 68): output ends inside a line"), "{err}");
        let mut torn = out[..30].to_vec();
        torn.extend_from_slice(&out[68..]);
        let mut scanner = FloodScanner::default();
        assert_eq!(scanner.feed(&torn).map_err(|e| e.contains("line 1 ")), Err(true));
    }

    #[test]
    fn a_stream_is_read_to_its_end_and_checked_as_it_comes() {
        let out = interleaved(3, 100, false);
        let (read, report) = scan_flood_stream(std::io::Cursor::new(&out), None);
        assert_eq!((read, report), (out.len() as u64, scan_flood(&out)));
        let mut damaged = out.clone();
        damaged[640] ^= 1;
        let (read, report) = scan_flood_stream(std::io::Cursor::new(&damaged), None);
        assert_eq!(read, damaged.len() as u64, "read on after the fault");
        assert_eq!(report, scan_flood(&damaged));
        // At 64 KiB/s the second read of 16 KiB waits until the first has had its 0.25 s.
        let started = Instant::now();
        let (read, report) = scan_flood_stream(std::io::Cursor::new(&out), Some(64 << 10));
        assert_eq!((read, report.map(|r| r.total_lines())), (out.len() as u64, Ok(300)));
        assert!(started.elapsed() >= Duration::from_millis(250), "{:?}", started.elapsed());
    }

    #[test]
    fn rejects_foreign_lines() {
        let out = [flood_line(0, 0).as_slice(), b"hello\n"].concat();
        let err = scan_flood(&out).unwrap_err();
        assert!(err.contains("not a flood line: \"hello\\n\""), "{err}");
    }
}
