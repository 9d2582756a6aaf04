//! The ways a rank can break the PMI protocol. Each ends its job; the text is the `what` of
//! [`super::PmiCall::Fault`], shown to the user after "rank N (pid P on host)", so it quotes
//! what the rank sent.

use pmi_wire::request::Protocol;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Fault {
    /// Bytes that do not parse as the protocol they began like; `error` is the codec's.
    #[error("sent a bad {} message ({error}): {sent}", name(*.protocol))]
    Malformed { protocol: Protocol, error: String, sent: String },
    #[error("sent an unknown {} command {cmd:?}: {sent}", name(*.protocol))]
    Unknown { protocol: Protocol, cmd: String, sent: String },
    /// More buffered than any message may be long, without a whole message in it.
    #[error("sent an overlong PMI message starting {head:?}")]
    Overlong { head: String },
    #[error("asked for PMI version {version}.{subversion}, which rlaunch does not speak")]
    Version { version: u32, subversion: u32 },
    /// `cmd=initack` where no `-pmi-port` handshake is due.
    #[error("sent a -pmi-port handshake (pmiid={pmiid}) on its PMI_FD socket")]
    Handshake { pmiid: u32 },
    /// More than `limit` bytes of keys and values put, fences or not.
    #[error("put more than {} MiB of keys and values", .limit >> 20)]
    TooMuchPut { limit: usize },
    /// A request naming another job's KVS; `what` names the request ("a put").
    #[error("sent {what} for kvsname {kvsname:?}, but its job's kvsname is {expected}")]
    ForeignKvs { what: &'static str, kvsname: String, expected: String },
}

fn name(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Pmi1 => "PMI-1",
        Protocol::Pmi2 => "PMI-2",
    }
}

impl Fault {
    pub(crate) fn malformed(protocol: Protocol, error: impl ToString, sent: &[u8]) -> Fault {
        Fault::Malformed { protocol, error: error.to_string(), sent: quote(sent) }
    }

    pub(crate) fn unknown(protocol: Protocol, cmd: String, text: &str) -> Fault {
        Fault::Unknown { protocol, cmd, sent: quote(text.as_bytes()) }
    }

    /// For a buffer that holds `buffered`, which is too much.
    pub(crate) fn overlong(buffered: &[u8]) -> Fault {
        let head = String::from_utf8_lossy(&buffered[..80.min(buffered.len())]).into_owned();
        Fault::Overlong { head }
    }
}

/// The start of what a rank sent, printable: its first line, at most 120 bytes, with `…`
/// when cut short.
fn quote(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == b'\n').unwrap_or(bytes.len()).min(120);
    let mut text = format!("{:?}", String::from_utf8_lossy(&bytes[..end]));
    if end < bytes.len() && bytes[end] != b'\n' {
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_as_users_see_them() {
        let bad = pmi_wire::pmi1::parse_request(b"cmd=get kvsname=k\n").unwrap_err();
        let cases = [
            (
                Fault::malformed(Protocol::Pmi1, bad, b"cmd=get kvsname=k\ncmd=barrier_in\n"),
                r#"sent a bad PMI-1 message (pmi-1 get: missing key): "cmd=get kvsname=k""#,
            ),
            (
                Fault::malformed(Protocol::Pmi2, "empty pmi-2 frame", b"000000"),
                r#"sent a bad PMI-2 message (empty pmi-2 frame): "000000""#,
            ),
            (
                Fault::unknown(Protocol::Pmi1, "frobnicate".into(), "cmd=frobnicate a=b"),
                r#"sent an unknown PMI-1 command "frobnicate": "cmd=frobnicate a=b""#,
            ),
            (
                Fault::unknown(Protocol::Pmi2, "frobnicate".into(), "cmd=frobnicate;"),
                r#"sent an unknown PMI-2 command "frobnicate": "cmd=frobnicate;""#,
            ),
            (
                Fault::overlong(&[b'a'; 100]),
                &format!("sent an overlong PMI message starting \"{}\"", "a".repeat(80)),
            ),
            (
                Fault::Version { version: 3, subversion: 1 },
                "asked for PMI version 3.1, which rlaunch does not speak",
            ),
            (
                Fault::Handshake { pmiid: 4 },
                "sent a -pmi-port handshake (pmiid=4) on its PMI_FD socket",
            ),
            (
                Fault::ForeignKvs { what: "a get", kvsname: "x".into(), expected: "kvs_1".into() },
                r#"sent a get for kvsname "x", but its job's kvsname is kvs_1"#,
            ),
        ];
        for (fault, text) in cases {
            assert_eq!(fault.to_string(), text);
        }
    }

    #[test]
    fn quotes_show_the_first_line_and_say_when_cut() {
        assert_eq!(quote(b"abc\ndef"), r#""abc""#);
        assert_eq!(quote(b"abc"), r#""abc""#);
        assert_eq!(quote(b"\0\xff"), "\"\\0\u{fffd}\"");
        let long = [b'x'; 200];
        assert_eq!(quote(&long), format!("\"{}\"…", "x".repeat(120)));
    }
}
