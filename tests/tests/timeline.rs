//! `--timeline FILE` (a Chrome trace of the launch) and `rlaunch timeline FILE -o PAGE`, the
//! page drawn from it, opened in a real browser (headless Chromium).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use rlaunch_tests::mpi::{fake_nodes, mpi_run, CProgram};
use rlaunch_tests::Run;
use serde_json::Value;

const NODES: usize = 16;

/// Chromium, headless, on `page`, with `args` (`--dump-dom`, `--screenshot=...`): its stdout.
fn chromium(page: &Path, args: &[&str]) -> String {
    // As root in a container: no sandbox, no GPU; a user-data directory of the test's own.
    let profile = format!("--user-data-dir={}", page.with_extension("profile").display());
    let url = format!("file://{}", page.display());
    let mut argv = vec!["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"];
    argv.push(&profile);
    argv.extend(args);
    argv.push(&url);
    let out = Run::program("/usr/bin/chromium", &argv).timeout(Duration::from_secs(90)).run();
    out.assert_code(0);
    out.stdout_str()
}

/// The value of `name="..."` in `text`.
fn attribute(text: &str, name: &str) -> Option<u64> {
    let at = text.find(&format!("{name}=\""))? + name.len() + 2;
    text[at..].split('"').next()?.parse().ok()
}

#[test]
fn a_sixteen_node_mpich_job_has_a_track_per_node_and_a_fence_span_per_epoch() {
    let dir = rlaunch_tests::tempdir();
    let trace_path = dir.join("trace.json");
    let mut options = fake_nodes(NODES, 1);
    options.extend(["--timeline".to_string(), trace_path.to_str().unwrap().to_string()]);
    let out = mpi_run(&options, NODES as u32, CProgram::Hello, &["16"]).run();
    out.assert_code(0);
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&trace_path).unwrap())
        .expect("the timeline is JSON");
    let fences = trace["otherData"]["fences"].as_u64().unwrap();
    assert!(fences >= 1, "MPICH's MPI_Init fences: {}", trace["otherData"]);
    let events = trace["traceEvents"].as_array().unwrap();

    let mut tracks = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "M" && e["name"] == "process_name") {
        tracks.insert(e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_string());
    }
    let nodes: Vec<&String> = tracks.values().filter(|n| n.starts_with("node ")).collect();
    assert_eq!(nodes.len(), NODES, "{tracks:?}");
    for (pid, name) in &tracks {
        let want = match pid {
            0 => "rlaunch".to_string(),
            pid => format!("node {}: n{pid}", pid - 1),
        };
        assert_eq!(name, &want);
    }

    let spans = |pid: u64, cat: &str| -> Vec<&Value> {
        events.iter().filter(|e| e["ph"] == "X" && e["pid"] == pid && e["cat"] == cat).collect()
    };
    let mut span_count = 1; // the job's
    for pid in 1..=NODES as u64 {
        let fence_spans = spans(pid, "fence");
        let epochs: BTreeSet<u64> =
            fence_spans.iter().map(|e| e["args"]["epoch"].as_u64().unwrap()).collect();
        assert_eq!(fence_spans.len() as u64, fences, "node {pid}: one span per epoch");
        assert_eq!(epochs, (0..fences).collect(), "node {pid}");
        for f in &fence_spans {
            assert_eq!(f["name"], format!("fence {}", f["args"]["epoch"]));
        }
        let launch: Vec<&str> =
            spans(pid, "launch").iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(launch, ["bootstrap", "spawn ranks"], "node {pid}");
        let ranks = spans(pid, "rank");
        assert_eq!(ranks.len(), 1, "node {pid}");
        assert_eq!(ranks[0]["name"], format!("rank {}", pid - 1));
        assert_eq!(ranks[0]["args"]["exit_code"], 0);
        for e in events.iter().filter(|e| e["pid"] == pid && e["ph"] == "X") {
            let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
            assert!(ts >= 0.0 && dur >= 0.0, "{e}");
        }
        span_count += fence_spans.len() + launch.len() + ranks.len();
        let instants: BTreeSet<&str> = events
            .iter()
            .filter(|e| e["ph"] == "i" && e["pid"] == pid)
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(instants, BTreeSet::from(["PMI init", "first output"]), "node {pid}");
    }

    // The page, drawn by rlaunch and laid out by Chromium: every track and span is there.
    let page = dir.join("timeline.html");
    let out =
        Run::new(&["timeline", trace_path.to_str().unwrap(), "-o", page.to_str().unwrap()]).run();
    out.assert_code(0);
    assert_eq!(out.stdout_str().trim(), page.to_str().unwrap());
    let dom = chromium(&page, &["--dump-dom"]);
    assert_eq!(attribute(&dom, "data-rendered-tracks"), Some(NODES as u64 + 1), "{dom:.2000}");
    assert_eq!(attribute(&dom, "data-rendered-spans"), Some(span_count as u64), "{dom:.2000}");
    let shot = dir.join("timeline.png");
    chromium(&page, &[&format!("--screenshot={}", shot.display())]);
    let png = std::fs::read(&shot).expect("Chromium wrote the screenshot");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(png.len() > 10_000, "a page of bars is more than {} bytes", png.len());

    // The bare SVG, for a report or a wiki.
    let svg_path = dir.join("timeline.svg");
    Run::new(&["timeline", "-o", svg_path.to_str().unwrap(), trace_path.to_str().unwrap()])
        .run()
        .assert_code(0);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""), "{svg:.200}");
    assert_eq!(attribute(&svg, "data-tracks"), Some(NODES as u64 + 1));
    assert_eq!(attribute(&svg, "data-spans"), Some(span_count as u64));
}

#[test]
fn the_page_command_names_what_is_wrong() {
    let out = Run::new(&["timeline"]).run();
    out.assert_code(2);
    assert_eq!(
        out.stderr_str(),
        "rlaunch: usage: rlaunch timeline TRACE.json [-o PAGE.html|PAGE.svg]\n"
    );
    let out = Run::new(&["timeline", "/nonexistent/t.json"]).run();
    out.assert_code(255);
    assert_eq!(
        out.stderr_str(),
        "rlaunch: cannot read /nonexistent/t.json: No such file or directory\n"
    );
    let dir = rlaunch_tests::tempdir();
    let junk = dir.join("junk.json");
    std::fs::write(&junk, "{\"traceEvents\": []}").unwrap();
    let out = Run::new(&["timeline", junk.to_str().unwrap()]).run();
    out.assert_code(255);
    assert_eq!(
        out.stderr_str(),
        format!("rlaunch: {}: not a Chrome trace: no spans or instants in it\n", junk.display())
    );
    assert!(!junk.with_extension("html").exists(), "nothing written for bad input");
}
