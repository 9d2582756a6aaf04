//! What `make install` puts beside the binaries, drawn from the same table as `--help-all`
//! (`args::OPTIONS`) and the same exit statuses (`exit::TABLE`), so that none of them can
//! drift from the command line: the manual page (`rlaunch.1`, written by the `roff` crate)
//! and the shell completions for bash, zsh and fish.
//!
//! ```text
//!   args::OPTIONS, exit::TABLE ──► manual()      ──► rlaunch.1
//!                              └─► completions() ──► rlaunch.bash, _rlaunch, rlaunch.fish
//! ```
//!
//! The completions are written here, not by `clap_complete`: it completes a `clap::Command`,
//! and rlaunch's spellings (Hydra's `-np`, `-genv`, Open MPI's `-x`) are single-dash long
//! options that clap cannot declare.

use roff::{bold, italic, roman, Roff};

use crate::args::{Arg, Opt, Topic, OPTIONS};
use crate::exit;

/// The names rlaunch answers to when installed with its MPI links (`make
/// install-mpi-links`): completions cover them too.
pub const NAMES: &[&str] = &["rlaunch", "mpiexec", "mpirun"];

/// What an option's value is, for completing it.
enum Completes {
    Files,
    Directories,
    Nothing,
}

fn completes(o: &Opt) -> Completes {
    match o.arg {
        Arg::Value("FILE" | "PATH") => Completes::Files,
        Arg::Value("DIR") => Completes::Directories,
        _ => Completes::Nothing,
    }
}

fn topics() -> Vec<Topic> {
    let mut topics: Vec<Topic> = OPTIONS.iter().map(|o| o.topic).collect();
    topics.sort();
    topics.dedup();
    topics
}

/// `rlaunch.1`.
pub fn manual() -> String {
    let mut page = Roff::new();
    let version = format!("rlaunch {}", env!("CARGO_PKG_VERSION"));
    page.control("TH", ["RLAUNCH", "1", "", &version, "User Commands"]);
    page.control("SH", ["NAME"]);
    page.text([roman(
        "rlaunch - launch an MPI-style parallel job: one proxy per node, ranks under the proxies",
    )]);
    page.control("SH", ["SYNOPSIS"]);
    page.text([
        bold("rlaunch"),
        roman(" ["),
        italic("OPTIONS"),
        roman("] [-n "),
        italic("N"),
        roman("] "),
        italic("PROGRAM"),
        roman(" ["),
        italic("ARGS"),
        roman("]... [: ["),
        italic("OPTIONS"),
        roman("] "),
        italic("PROGRAM"),
        roman(" ["),
        italic("ARGS"),
        roman("]...]..."),
    ]);
    page.control("SH", ["DESCRIPTION"]);
    page.text([roman(
        "rlaunch starts one proxy (rlaunch-proxy) per node, over fork, ssh or rsh, or a \
         scheduler's own launcher (Slurm's srun, Grid Engine's qrsh, LSF's blaunch), arranged \
         in a tree. Each proxy starts its node's ranks and relays their output, stdin, signals \
         and exit status, and serves them PMI-1, PMI-2 (MPICH) and PMIx (Open MPI). It reads \
         the command lines of MPICH's Hydra (mpiexec) and Open MPI's mpirun, so it can be \
         installed under those names.",
    )]);
    for topic in topics() {
        page.control("SH", [crate::help::title(topic).to_uppercase().as_str()]);
        for o in OPTIONS.iter().filter(|o| o.topic == topic) {
            page.control("TP", []);
            let mut head = Vec::new();
            for (i, name) in o.names.iter().enumerate() {
                if i > 0 {
                    head.push(roman(", "));
                }
                head.push(bold(*name));
            }
            match o.arg {
                Arg::None => {}
                Arg::Value(v) => head.extend([roman(" "), italic(v)]),
                Arg::Pair => head.extend([roman(" "), italic("NAME"), roman(" "), italic("VALUE")]),
            }
            page.text(head);
            page.text([roman(o.help)]);
        }
    }
    page.control("SH", ["EXIT STATUS"]);
    for row in exit::TABLE {
        page.control("TP", []);
        page.text([bold(row.status)]);
        page.text([roman(row.meaning.replace('`', ""))]);
    }
    page.control("SH", ["ENVIRONMENT"]);
    for (var, what) in ENVIRONMENT {
        page.control("TP", []);
        page.text([bold(*var)]);
        page.text([roman(*what)]);
    }
    page.control("SH", ["SEE ALSO"]);
    page.text([roman(
        "mpiexec.hydra(1), mpirun.openmpi(1), srun(1); rlaunch --help-all, rlaunch --info",
    )]);
    page.render()
}

/// The variables rlaunch reads, for the manual.
const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "RLAUNCH_LOG",
        "error, warn, info, debug or trace: how much rlaunch and its proxies log (-v, -vv)",
    ),
    ("RLAUNCH_HOSTFILE, HYDRA_HOST_FILE", "a hostfile, when no host option is given"),
    ("RLAUNCH_LAUNCHER, HYDRA_LAUNCHER", "the default of --launcher"),
    ("RLAUNCH_LAUNCHER_EXEC, HYDRA_LAUNCHER_EXEC", "the default of --launcher-exec"),
    ("RLAUNCH_TIMEOUT, MPIEXEC_TIMEOUT", "the default of --timeout"),
    ("RLAUNCH_PROGRESS", "0: never show the progress line on a terminal"),
    ("RLAUNCH_SPLICE", "0: copy output through the proxies instead of splicing it"),
];

/// The completion script for `shell` (bash, zsh or fish), for every name in [`NAMES`].
pub fn completions(shell: &str) -> Option<String> {
    match shell {
        "bash" => Some(bash()),
        "zsh" => Some(zsh()),
        "fish" => Some(fish()),
        _ => None,
    }
}

fn spellings(pick: impl Fn(&Opt) -> bool) -> String {
    let names: Vec<&str> =
        OPTIONS.iter().filter(|o| pick(o)).flat_map(|o| o.names.iter().copied()).collect();
    names.join(" ")
}

fn bash() -> String {
    let files = spellings(|o| matches!(completes(o), Completes::Files)).replace(' ', "|");
    let dirs = spellings(|o| matches!(completes(o), Completes::Directories)).replace(' ', "|");
    let valued = spellings(|o| o.arg != Arg::None && matches!(completes(o), Completes::Nothing));
    format!(
        r#"# bash completion for rlaunch (and its mpiexec and mpirun names), from rlaunch's option table
_rlaunch() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    case $prev in
        {files}) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        {dirs}) COMPREPLY=($(compgen -d -- "$cur")); return ;;
    esac
    local valued=" {valued} "
    if [[ $valued == *" $prev "* ]]; then
        COMPREPLY=()
        return
    fi
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "{all}" -- "$cur"))
        return
    fi
    COMPREPLY=($(compgen -c -- "$cur") $(compgen -f -- "$cur"))
}}
complete -F _rlaunch {names}
"#,
        all = spellings(|_| true),
        names = NAMES.join(" "),
    )
}

fn zsh() -> String {
    let mut specs = String::new();
    for o in OPTIONS {
        let action = match (o.arg, completes(o)) {
            (Arg::None, _) => String::new(),
            (_, Completes::Files) => ":file:_files".into(),
            (_, Completes::Directories) => ":directory:_files -/".into(),
            (Arg::Pair, _) => ":name: :value: ".into(),
            (Arg::Value(v), _) => format!(":{}: ", v.to_lowercase()),
        };
        let help = o.help.replace(['[', ']'], "").replace('\'', "'\\''");
        for name in o.names {
            specs.push_str(&format!("    '{name}[{help}]{action}' \\\n"));
        }
    }
    format!(
        "#compdef {names}\n# zsh completion for rlaunch, from rlaunch's option table\n\
         _arguments -S \\\n{specs}    '*::command:_normal'\n",
        names = NAMES.join(" "),
    )
}

fn fish() -> String {
    let mut out = String::from("# fish completion for rlaunch, from rlaunch's option table\n");
    for command in NAMES {
        for o in OPTIONS {
            let help = o.help.replace('\'', "\\'");
            let value = match (o.arg, completes(o)) {
                (Arg::None, _) => "",
                (_, Completes::Files) => " -r -F",
                (_, Completes::Directories) => " -r -a '(__fish_complete_directories)'",
                _ => " -r",
            };
            for name in o.names {
                // fish's -l is --long, -o is -old-style (one dash, several letters), -s one
                // letter.
                let flag = match name.strip_prefix("--") {
                    Some(long) => format!("-l '{long}'"),
                    None if name.len() == 2 => format!("-s '{}'", &name[1..]),
                    None => format!("-o '{}'", &name[1..]),
                };
                out.push_str(&format!("complete -c {command} {flag}{value} -d '{help}'\n"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of the repository, as a path from its root.
    fn repository_files() -> Vec<String> {
        fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                let path = entry.path();
                let name = entry.file_name();
                if [".git", "target", "fuzz"].contains(&name.to_str().unwrap_or("")) {
                    continue;
                }
                if path.is_dir() {
                    walk(&path, root, out);
                } else {
                    out.push(path.strip_prefix(root).unwrap().to_string_lossy().into_owned());
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let root = root.canonicalize().unwrap();
        let mut out = Vec::new();
        walk(&root, &root, &mut out);
        out
    }

    #[test]
    fn every_source_file_the_architecture_names_exists() {
        // A path in backquotes ending in a source file's extension: whole from the root, or
        // the end of one (`node/mod.rs`, `plan/place.rs`).
        let text = include_str!("../../../docs/architecture.md");
        let files = repository_files();
        let named: Vec<&str> = text
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|t| !t.contains(' '))
            .filter(|t| [".rs", ".c", ".py", ".sh", ".md"].iter().any(|ext| t.ends_with(ext)))
            .collect();
        assert!(named.len() > 20, "the architecture names its files: {named:?}");
        for name in named {
            let found = files.iter().any(|f| f == name || f.ends_with(&format!("/{name}")));
            assert!(found, "docs/architecture.md names {name}, which is no file of the repository");
        }
    }

    #[test]
    fn the_manual_names_every_spelling_and_every_exit_status() {
        let page = manual();
        for o in OPTIONS {
            for name in o.names {
                // roff writes a hyphen as \-.
                let written = name.replace('-', "\\-");
                assert!(page.contains(&written), "{name} is missing from the manual");
            }
        }
        for row in exit::TABLE {
            assert!(page.contains(&row.status.replace('-', "\\-")), "{}", row.status);
        }
    }

    #[test]
    fn every_shell_completes_every_spelling() {
        for shell in ["bash", "zsh", "fish"] {
            let script = completions(shell).unwrap();
            for o in OPTIONS {
                for name in o.names {
                    let bare = name.trim_start_matches('-');
                    assert!(script.contains(bare), "{shell} lacks {name}");
                }
            }
        }
        assert!(completions("csh").is_none());
    }
}
