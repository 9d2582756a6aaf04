//! What every decoder of pmi-wire and rlaunch-protocol must hold to, whatever the bytes: nothing panics, a decoded
//! message never claims more bytes than it was given, and whatever decodes re-encodes to
//! something that decodes to the same value. Shared by the deterministic fuzzing test
//! (tests/fuzz_codecs.rs), the replay of the fuzzers' corpora
//! (crates/launcher/tests/fuzz_corpus.rs) and the cargo-fuzz targets (fuzz/fuzz_targets/),
//! which include this file by path.

use pmi_wire::request::{Message, SpawnBlocks};
use pmi_wire::{pmi1, pmi2};
use rlaunch_protocol::control::{self, DownFrame, UpFrame};

/// PMI-1: requests and responses, re-encoding, the mapping to the protocol-neutral request,
/// and a connection's draining of messages off the front (spawn blocks gathered).
pub fn pmi1(input: &[u8]) {
    let len = input.len();
    if let Ok(Some((req, n))) = pmi1::parse_request(input) {
        assert!(n > 0 && n <= len, "pmi1 request took {n} of {len}");
        let again = req.encode();
        // Re-encoding can lengthen a block (counts it left out), past the block limit.
        if again.len() <= pmi1::MAX_LINE || matches!(req, pmi1::Request::Spawn(_)) {
            if let Ok(Some((back, m))) = pmi1::parse_request(&again) {
                assert_eq!(back, req, "pmi1 re-encoding of {input:?}");
                assert_eq!(m, again.len());
            } else {
                panic!("pmi1 re-encoding of {input:?} did not parse: {again:?}");
            }
        }
        if let Some(message) = Message::from_pmi1(req, &mut SpawnBlocks::default()) {
            check_mapping(message, pmi2::Protocol::Pmi1);
        }
    }
    if let Ok(Some((_, n))) = pmi1::parse_response(input) {
        assert!(n > 0 && n <= len, "pmi1 response took {n} of {len}");
    }
    let mut rest = input;
    let mut spawn = SpawnBlocks::default();
    let mut blocks = 0;
    while let Ok(Some((request, n))) = pmi1::parse_request(rest) {
        rest = &rest[n..];
        blocks += usize::from(matches!(request, pmi1::Request::Spawn(_)));
        if let Some(message) = Message::from_pmi1(request, &mut spawn) {
            if let Message::Request(pmi_wire::request::Envelope {
                request: pmi_wire::request::Request::Spawn(whole),
                ..
            }) = &message
            {
                assert_eq!(whole.cmds.len(), blocks, "one command per block");
                blocks = 0;
            }
            check_mapping(message, pmi2::Protocol::Pmi1);
        }
    }
}

/// PMI-2: frames, typed requests and their re-encoding, detection, and draining.
pub fn pmi2(input: &[u8]) {
    let len = input.len();
    if let Ok(Some((command, n))) = pmi2::parse_frame(input) {
        assert!(n > pmi2::HEADER_LEN && n <= len, "pmi2 frame took {n} of {len}");
        let again = command.encode();
        let (back, m) = pmi2::parse_frame(&again).expect("re-encoded frame").expect("complete");
        assert_eq!((back, m), (command.clone(), again.len()));
        if let Ok(req) = pmi2::Request::from_command(&command) {
            let back = pmi2::Request::from_command(&req.to_command()).expect("typed re-encoding");
            assert_eq!(back, req);
        }
    }
    if let Ok(Some((envelope, n))) = pmi2::parse_request(input) {
        assert!(n <= len);
        check_mapping(Message::from_pmi2(envelope), pmi2::Protocol::Pmi2);
    }
    let _ = pmi2::detect(input);
    let mut rest = input;
    while let Ok(Some((_, n))) = pmi2::parse_frame(rest) {
        rest = &rest[n..];
    }
}

/// The control channel: frames up and down the tree, and the hello scan.
pub fn control(input: &[u8]) {
    let len = input.len();
    if let Ok(Some((_, n))) = control::decode::<UpFrame>(input) {
        assert!(n <= len, "up frame took {n} of {len}");
    }
    if let Ok(Some((_, n))) = control::decode::<DownFrame>(input) {
        assert!(n <= len, "down frame took {n} of {len}");
    }
    if let Ok(Some(found)) = control::scan_hello(input) {
        assert!(found.consumed <= len);
    }
}

/// A mapped message keeps its protocol; a spawn mapped from PMI-1 holds one command per block.
fn check_mapping(message: Message, protocol: pmi2::Protocol) {
    match message {
        Message::Request(envelope) => {
            assert_eq!(envelope.protocol, protocol);
            assert!(protocol == pmi2::Protocol::Pmi2 || envelope.tag.is_none());
        }
        Message::Unknown { protocol: p, .. } => assert_eq!(p, protocol),
        Message::Init { .. } | Message::InitAck { .. } => {
            assert_eq!(protocol, pmi2::Protocol::Pmi1)
        }
    }
}
