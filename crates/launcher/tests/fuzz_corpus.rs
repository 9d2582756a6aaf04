//! Every input the cargo-fuzz targets of rlaunch's parsers kept (fuzz/corpus/TARGET) or
//! crashed on (fuzz/artifacts/TARGET) goes through the same properties here, in the test
//! command, so that a fixed crash stays fixed. docs/fuzzing.md runs the targets themselves.

#[test]
fn the_fuzzers_corpora_and_crashes_replay_cleanly() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut replayed = 0;
    for (target, property) in [
        ("hostfile", rlaunch::fuzzing::hostfile as fn(&[u8])),
        ("command_line", rlaunch::fuzzing::command_line),
    ] {
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
                replayed += 1;
            }
        }
    }
    assert!(replayed > 0, "no corpus under {}", root.display());
}
