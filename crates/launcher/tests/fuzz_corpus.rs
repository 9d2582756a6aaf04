//! Every input the cargo-fuzz targets kept (fuzz/corpus/TARGET) or crashed on
//! (fuzz/artifacts/TARGET), of every target, goes through that target's properties here, in
//! the test command, so that a fixed crash stays fixed. The parsers' properties are
//! rlaunch's (`rlaunch::fuzzing`), the codecs' are rlaunch-protocol's
//! (crates/protocol/tests/properties, included by path as the fuzz targets include it).
//! docs/reliability.md (Fuzzing) runs the targets themselves.

#[path = "../../protocol/tests/properties/mod.rs"]
mod properties;

#[test]
fn the_fuzzers_corpora_and_crashes_replay_cleanly() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut replayed = 0;
    for (target, property) in [
        ("hostfile", rlaunch::fuzzing::hostfile as fn(&[u8])),
        ("command_line", rlaunch::fuzzing::command_line),
        ("pmi1", properties::pmi1),
        ("pmi2", properties::pmi2),
        ("control", properties::control),
    ] {
        let mut kept = 0;
        for dir in ["corpus", "artifacts"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else { continue };
            for entry in entries {
                let path = entry.expect("a directory entry").path();
                let input = match std::fs::read(&path) {
                    Ok(input) => input,
                    // A fuzzer running now replaces corpus files as it shrinks them.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => panic!("cannot read {}: {e}", path.display()),
                };
                property(&input);
                kept += 1;
            }
        }
        assert!(kept > 0, "no corpus for {target} under {}", root.display());
        replayed += kept;
    }
    println!("{replayed} inputs replayed");
}
