//! `rlaunch timeline TRACE.json [-o PAGE.html|PAGE.svg]`: draws a `--timeline` trace (or
//! any Chrome trace of complete spans) as one self-contained page: an SVG with a track per
//! process (a node), a row per thread (its proxy, its ranks), spans as bars and instants as
//! ticks, each with a tooltip. No network, no JavaScript framework: a dozen lines of script
//! only count what the browser laid out (`data-rendered-*` on the body), for whoever checks.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::quote::cut;

/// Width of the label column and of the time axis, and the height of a row, in pixels.
const LABEL_W: f64 = 190.0;
const PLOT_W: f64 = 1100.0;
const ROW_H: f64 = 16.0;
const TOP: f64 = 40.0;

#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("usage: rlaunch timeline TRACE.json [-o PAGE.html|PAGE.svg]")]
    Usage,
    #[error("cannot read {}: {}", cut(&.0.to_string_lossy()), crate::quote::io_error(.1))]
    Read(PathBuf, std::io::Error),
    #[error("{}: not a Chrome trace: {}", cut(&.0.to_string_lossy()), cut(.1))]
    NotATrace(PathBuf, String),
    #[error("cannot write {}: {}", cut(&.0.to_string_lossy()), crate::quote::io_error(.1))]
    Write(PathBuf, std::io::Error),
}

impl PageError {
    /// The exit status: 2 for a wrong command line, 255 for a file that cannot be used.
    pub fn exit_code(&self) -> i32 {
        match self {
            PageError::Usage => crate::exit::USAGE,
            _ => crate::exit::FAILURE,
        }
    }
}

/// Runs `rlaunch timeline ARGS` (the words after `timeline`); returns the page's path.
pub fn run(args: &[std::ffi::OsString]) -> Result<PathBuf, PageError> {
    let (input, output) = match args {
        [input] => (PathBuf::from(input), None),
        [input, o, out] if o == "-o" => (PathBuf::from(input), Some(PathBuf::from(out))),
        [o, out, input] if o == "-o" => (PathBuf::from(input), Some(PathBuf::from(out))),
        _ => return Err(PageError::Usage),
    };
    let output = output.unwrap_or_else(|| input.with_extension("html"));
    let text = std::fs::read_to_string(&input).map_err(|e| PageError::Read(input.clone(), e))?;
    let trace: Value = serde_json::from_str(&text)
        .map_err(|e| PageError::NotATrace(input.clone(), e.to_string()))?;
    let trace = Trace::read(&trace).map_err(|why| PageError::NotATrace(input.clone(), why))?;
    let svg = trace.svg();
    let page = if is_svg(&output) { svg } else { html(&trace, &svg, &input) };
    std::fs::write(&output, page).map_err(|e| PageError::Write(output.clone(), e))?;
    Ok(output)
}

fn is_svg(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg"))
}

struct Span {
    name: String,
    cat: String,
    start: f64,
    dur: Option<f64>,
}

#[derive(Default)]
struct Row {
    name: String,
    sort: i64,
    spans: Vec<Span>,
}

#[derive(Default)]
struct Track {
    name: String,
    sort: i64,
    rows: BTreeMap<i64, Row>,
}

struct Trace {
    tracks: BTreeMap<i64, Track>,
    /// The first and last instants of the trace, microseconds.
    from: f64,
    to: f64,
    title: String,
}

impl Trace {
    fn read(trace: &Value) -> Result<Trace, String> {
        let events = match trace {
            Value::Array(events) => events,
            Value::Object(o) => {
                o.get("traceEvents").and_then(Value::as_array).ok_or("no traceEvents array")?
            }
            _ => return Err("neither an object nor an array".into()),
        };
        let mut tracks: BTreeMap<i64, Track> = BTreeMap::new();
        let (mut from, mut to) = (f64::INFINITY, f64::NEG_INFINITY);
        for e in events {
            let num = |k: &str| e.get(k).and_then(Value::as_f64);
            let int = |k: &str| e.get(k).and_then(Value::as_i64).unwrap_or(0);
            let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let (pid, tid) = (int("pid"), int("tid"));
            let track =
                tracks.entry(pid).or_insert_with(|| Track { sort: pid, ..Track::default() });
            let arg = |k: &str| e.get("args").and_then(|a| a.get(k)).cloned();
            match text("ph").as_str() {
                "M" => match text("name").as_str() {
                    "process_name" => {
                        track.name = arg("name")
                            .and_then(|v| v.as_str().map(String::from))
                            .unwrap_or_default()
                    }
                    "process_sort_index" => {
                        track.sort = arg("sort_index").and_then(|v| v.as_i64()).unwrap_or(pid)
                    }
                    "thread_name" => {
                        let row = track
                            .rows
                            .entry(tid)
                            .or_insert_with(|| Row { sort: tid, ..Row::default() });
                        row.name = arg("name")
                            .and_then(|v| v.as_str().map(String::from))
                            .unwrap_or_default();
                    }
                    "thread_sort_index" => {
                        let row = track
                            .rows
                            .entry(tid)
                            .or_insert_with(|| Row { sort: tid, ..Row::default() });
                        row.sort = arg("sort_index").and_then(|v| v.as_i64()).unwrap_or(tid);
                    }
                    _ => {}
                },
                ph @ ("X" | "i" | "I") => {
                    let Some(start) = num("ts") else { continue };
                    let dur =
                        if ph == "X" { Some(num("dur").unwrap_or(0.0).max(0.0)) } else { None };
                    from = from.min(start);
                    to = to.max(start + dur.unwrap_or(0.0));
                    let row = track
                        .rows
                        .entry(tid)
                        .or_insert_with(|| Row { sort: tid, ..Row::default() });
                    row.spans.push(Span { name: text("name"), cat: text("cat"), start, dur });
                }
                _ => {}
            }
        }
        tracks.retain(|_, t| t.rows.values().any(|r| !r.spans.is_empty()));
        if tracks.is_empty() {
            return Err("no spans or instants in it".into());
        }
        let title = trace
            .get("otherData")
            .and_then(|d| d.get("jobid"))
            .and_then(Value::as_str)
            .unwrap_or("trace")
            .to_string();
        Ok(Trace { tracks, from, to: to.max(from + 1.0), title })
    }

    fn x(&self, t: f64) -> f64 {
        LABEL_W + (t - self.from) / (self.to - self.from) * PLOT_W
    }

    fn svg(&self) -> String {
        let mut tracks: Vec<&Track> = self.tracks.values().collect();
        tracks.sort_by_key(|t| t.sort);
        let rows: usize = tracks.iter().map(|t| t.rows.len()).sum();
        let height = TOP + rows as f64 * ROW_H + tracks.len() as f64 * 6.0 + 20.0;
        let width = LABEL_W + PLOT_W + 20.0;
        let spans = self.count(|s| s.dur.is_some());
        let instants = self.count(|s| s.dur.is_none());
        let mut out = String::new();
        let _ = write!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" id="timeline" width="{width}" height="{height}" viewBox="0 0 {width} {height}" data-tracks="{}" data-spans="{spans}" data-instants="{instants}" font-family="sans-serif" font-size="11">"#,
            tracks.len()
        );
        out.push_str(STYLE);
        self.axis(&mut out, height);
        let mut y = TOP;
        for track in tracks {
            let kind = if track.name.starts_with("node ") { "node" } else { "other" };
            let _ = write!(
                out,
                r#"<g class="track" data-kind="{kind}" data-name="{}"><text class="track-name" x="4" y="{}">{}</text>"#,
                esc(&track.name),
                y + 11.0,
                esc(&track.name)
            );
            let mut rows: Vec<&Row> = track.rows.values().collect();
            rows.sort_by_key(|r| r.sort);
            for row in rows {
                let _ = write!(out, r#"<g class="row" data-name="{}">"#, esc(&row.name));
                if !row.name.is_empty() && row.name != "proxy" {
                    let _ = write!(
                        out,
                        r#"<text class="row-name" x="24" y="{}">{}</text>"#,
                        y + 11.0,
                        esc(&row.name)
                    );
                }
                for span in &row.spans {
                    self.draw(&mut out, span, y);
                }
                out.push_str("</g>");
                y += ROW_H;
            }
            out.push_str("</g>");
            y += 6.0;
        }
        out.push_str("</svg>");
        out
    }

    fn count(&self, which: impl Fn(&Span) -> bool) -> usize {
        self.tracks
            .values()
            .flat_map(|t| t.rows.values())
            .flat_map(|r| &r.spans)
            .filter(|s| which(s))
            .count()
    }

    fn draw(&self, out: &mut String, span: &Span, y: f64) {
        let at = (span.start - self.from) / 1000.0;
        let x = self.x(span.start);
        match span.dur {
            Some(dur) => {
                // At least a pixel wide, so that a short fence still shows.
                let w = (self.x(span.start + dur) - x).max(1.0);
                let _ = write!(
                    out,
                    r#"<rect class="span {cat}" data-cat="{cat}" data-name="{name}" x="{x:.2}" y="{:.2}" width="{w:.2}" height="{:.2}"><title>{name}: {:.3} ms, from {at:.3} ms</title></rect>"#,
                    y + 2.0,
                    ROW_H - 4.0,
                    dur / 1000.0,
                    cat = esc(&span.cat),
                    name = esc(&span.name),
                );
            }
            None => {
                let _ = write!(
                    out,
                    r#"<path class="instant" data-name="{name}" d="M{x:.2} {:.2} l4 6 l-8 0 z"><title>{name} at {at:.3} ms</title></path>"#,
                    y + 2.0,
                    name = esc(&span.name),
                );
            }
        }
    }

    /// Time ticks along the top: 1, 2 or 5 times a power of ten, about ten of them.
    fn axis(&self, out: &mut String, height: f64) {
        let span_ms = (self.to - self.from) / 1000.0;
        let raw = span_ms / 10.0;
        let power = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .into_iter()
            .map(|m| m * power)
            .find(|s| *s >= raw)
            .unwrap_or(power);
        let mut t = 0.0;
        while t <= span_ms + 1e-9 {
            let x = self.x(self.from + t * 1000.0);
            let _ = write!(
                out,
                r#"<line class="tick" x1="{x:.2}" y1="{}" x2="{x:.2}" y2="{height}"/><text class="tick-label" x="{x:.2}" y="{}">{} ms</text>"#,
                TOP - 8.0,
                TOP - 12.0,
                trim(t)
            );
            t += step;
        }
    }
}

fn trim(ms: f64) -> String {
    let s = format!("{ms:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Text for XML: `&`, `<`, `>` and quotes escaped.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "<style>\
    .track-name{font-weight:bold}.row-name{fill:#444}\
    .tick{stroke:#ddd}.tick-label{fill:#666;text-anchor:middle}\
    .span{fill:#bab0ac}.span.launch{fill:#4e79a7}.span.fence{fill:#f28e2b}\
    .span.rank{fill:#59a14f;opacity:.8}.span.job{fill:#bab0ac}\
    .span.tracker{fill:#b07aa1}\
    .instant{fill:#e15759}</style>";

fn html(trace: &Trace, svg: &str, input: &Path) -> String {
    let title = esc(&format!("{} ({})", trace.title, input.display()));
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title>\
         <style>body{{font-family:sans-serif;margin:12px}}</style></head>\
         <body><h3>{title}</h3><p>Tracks: nodes (and rlaunch); rows: each node's proxy and \
         ranks. Blue: bootstrap and spawn; orange: fences; green: ranks; red ticks: PMI init and \
         first output. Hover for times.</p>\n{svg}\n<script>\
         (function(){{var s=document.getElementById('timeline');var r=0,t=0;\
         s.querySelectorAll('rect.span').forEach(function(e){{if(e.getBBox().width>0)r++;}});\
         s.querySelectorAll('g.track').forEach(function(g){{if(g.getBBox().height>0)t++;}});\
         document.body.dataset.renderedSpans=r;document.body.dataset.renderedTracks=t;}})();\
         </script></body></html>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_draws_a_track_per_process_and_a_bar_per_span() {
        let trace = serde_json::json!({ "traceEvents": [
            { "name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": { "name": "node 0: a<b>" } },
            { "name": "fence 0", "cat": "fence", "ph": "X", "ts": 10.0, "dur": 5.0, "pid": 1, "tid": 0 },
            { "name": "rank 0", "cat": "rank", "ph": "X", "ts": 0.0, "dur": 100.0, "pid": 1, "tid": 1 },
            { "name": "PMI init", "cat": "rank", "ph": "i", "ts": 3.0, "pid": 1, "tid": 1, "s": "t" },
            { "name": "job", "cat": "job", "ph": "X", "ts": 0.0, "dur": 120.0, "pid": 0, "tid": 0 },
        ]});
        let svg = Trace::read(&trace).unwrap().svg();
        assert!(svg.contains(r#"data-tracks="2" data-spans="3" data-instants="1""#), "{svg}");
        assert_eq!(svg.matches(r#"<g class="track""#).count(), 2);
        assert!(svg.contains("node 0: a&lt;b&gt;"), "names are escaped: {svg}");
        assert!(Trace::read(&serde_json::json!({ "traceEvents": [] })).is_err());
        assert!(Trace::read(&serde_json::json!(7)).is_err());
    }
}
