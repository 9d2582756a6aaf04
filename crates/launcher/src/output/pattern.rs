//! The patterns of `--outfile-pattern`, `--errfile-pattern` and `--prepend-pattern`: parsed
//! (and refused) once on the command line, expanded once per rank when it starts.

use std::fmt::Write;

/// The escapes a pattern may hold, for error messages.
const KNOWN: &str = "%r %g %h %t %%";

/// What the escapes of a pattern stand for, for one rank.
pub(crate) struct RankFacts<'a> {
    /// `%r`: the rank (for ranks of spawned jobs, their global id).
    pub rank: u32,
    /// `%g`: the rank's pid.
    pub pid: u32,
    /// `%h`: the host of the rank's node, as the host list names it.
    pub host: &'a str,
    /// `%t`: the id of the rank's job.
    pub jobid: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Rank,
    Pid,
    Host,
    JobId,
}

/// A parsed pattern: literal text and escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pattern {
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PatternError {
    /// The character is shown escaped: a pattern can hold a newline (found by fuzzing).
    #[error("unknown escape %{} (known: {KNOWN})", .0.escape_debug())]
    UnknownEscape(char),
    #[error("a % at the end escapes nothing (known: {KNOWN}; %% is a percent sign)")]
    Dangling,
}

impl Pattern {
    pub(crate) fn parse(text: &str) -> Result<Pattern, PatternError> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                literal.push(c);
                continue;
            }
            let piece = match chars.next().ok_or(PatternError::Dangling)? {
                '%' => {
                    literal.push('%');
                    continue;
                }
                'r' => Piece::Rank,
                'g' => Piece::Pid,
                'h' => Piece::Host,
                't' => Piece::JobId,
                other => return Err(PatternError::UnknownEscape(other)),
            };
            if !literal.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut literal)));
            }
            pieces.push(piece);
        }
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        Ok(Pattern { pieces })
    }

    pub(crate) fn expand(&self, facts: &RankFacts) -> String {
        let mut out = String::new();
        self.expand_into(facts, &mut out);
        out
    }

    pub(crate) fn expand_into(&self, facts: &RankFacts, out: &mut String) {
        for piece in &self.pieces {
            // Writing into a String cannot fail.
            let _ = match piece {
                Piece::Text(text) => out.write_str(text),
                Piece::Rank => write!(out, "{}", facts.rank),
                Piece::Pid => write!(out, "{}", facts.pid),
                Piece::Host => out.write_str(facts.host),
                Piece::JobId => out.write_str(facts.jobid),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FACTS: RankFacts = RankFacts { rank: 3, pid: 4242, host: "node07", jobid: "job_1" };

    fn expand(pattern: &str) -> String {
        Pattern::parse(pattern).unwrap().expand(&FACTS)
    }

    #[test]
    fn escapes_expand_and_text_stays() {
        assert_eq!(expand("out.%r.%g"), "out.3.4242");
        assert_eq!(expand("%h:%t:%r"), "node07:job_1:3");
        assert_eq!(expand("100%% of %r"), "100% of 3");
        assert_eq!(expand("%%r"), "%r");
        assert_eq!(expand(""), "");
        assert_eq!(expand("plain ünïcode"), "plain ünïcode");
    }

    #[test]
    fn unknown_and_dangling_escapes_are_refused() {
        assert_eq!(Pattern::parse("out.%x"), Err(PatternError::UnknownEscape('x')));
        assert_eq!(
            PatternError::UnknownEscape('x').to_string(),
            "unknown escape %x (known: %r %g %h %t %%)"
        );
        assert_eq!(Pattern::parse("out.%"), Err(PatternError::Dangling));
        assert_eq!(Pattern::parse("%%%"), Err(PatternError::Dangling));
        assert!(Pattern::parse("%%%%").is_ok());
    }
}
